# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
t0=$(date +%s)
rm -rf "$OUT/goldens"
if python3 scripts/make_goldens.py "$Q" "$OUT/goldens" 2>&1 | tee "$OUT/goldens.log" | grep -vE "^\s*$" | tail -20; then
    tar -C "$OUT" -cf "$OUT/goldens.tar" goldens && rm -rf "$OUT/goldens"
    note "goldens: made in $(( $(date +%s) - t0 )) s"
else
    note "goldens: FAILED (see goldens.log)"
fi
