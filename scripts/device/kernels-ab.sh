# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# An A/B of a kernel switch: `qinfer bench --kernels KAB_ARGS` under KAB_VAR=value for each of KAB_VALUES (default
# "0 1"), alternated KAB_ROUNDS times (default 2), one table and JSON per run; then, where KAB_SASS names a source file
# (e.g. qgemm_mma.cu), its object's machine code by cuobjdump with the instructions of each kernel counted
# (scripts/sass_counts.py).
for r in $(seq "${KAB_ROUNDS:-2}"); do
    for v in ${KAB_VALUES:-0 1}; do
        # shellcheck disable=SC2086  # KAB_ARGS splits into words on purpose
        env "$KAB_VAR=$v" "$Q" bench --kernels ${KAB_ARGS:-} --json "$OUT/kab-$KAB_VAR-$v-$r.json" 2>&1 |
            tee "$OUT/kab-$KAB_VAR-$v-$r.md" | grep -E "^\| |error" | sed "s/^/$KAB_VAR=$v r$r: /" | tee -a "$OUT/kernels-ab.log"
    done
done
if [ -n "${KAB_SASS:-}" ]; then
    obj=$(find build-device -name "$KAB_SASS.o" | head -1)
    if [ -n "$obj" ] && command -v cuobjdump >/dev/null; then
        cuobjdump -sass "$obj" | gzip >"$OUT/sass-$KAB_SASS.txt.gz"
        zcat "$OUT/sass-$KAB_SASS.txt.gz" | python3 scripts/sass_counts.py | tee -a "$OUT/kernels-ab.log"
    else
        note "kernels-ab: no object for $KAB_SASS or no cuobjdump"
    fi
fi
