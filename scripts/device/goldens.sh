# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# transformers' goldens for tests/data/goldens (scripts/make_goldens.py); GOLDENS_ARGS passes it options, e.g.
# --quant-only. The files come back as goldens.tar.
t0=$(date +%s)
rm -rf "$OUT/goldens"
if python3 scripts/make_goldens.py "$Q" "$OUT/goldens" ${GOLDENS_ARGS:-} 2>&1 | tee "$OUT/goldens.log" | grep -vE "^\s*$" | tail -20; then
    tar -C "$OUT" -cf "$OUT/goldens.tar" goldens && rm -rf "$OUT/goldens"
    note "goldens: made in $(( $(date +%s) - t0 )) s"
else
    note "goldens: FAILED (see goldens.log)"
fi
