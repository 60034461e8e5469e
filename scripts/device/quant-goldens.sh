# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
rm -rf "$OUT/goldens"
if python3 scripts/make_goldens.py "$Q" "$OUT/goldens" --quant-only 2>&1 | tee "$OUT/goldens.log" | tail -8; then
    tar -C "$OUT" -cf "$OUT/goldens.tar" goldens && rm -rf "$OUT/goldens"
    note "quant goldens: made"
else
    note "quant goldens: FAILED (see goldens.log)"
fi
