# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# 8-bit and bitsandbytes codes in the tile layout (default) against the untiled fp32 kernels (QINFER_QTILE=affine4):
# the quantized/GEMV/golden tests, then 7B decode speed per format, alternated in the same run.
build-device/tests/qinfer_tests --gtest_filter='*Quant*:*Gemv*:*GoldenCuda*' >"$OUT/tile-test.log" 2>&1
note "quant/gemv/golden tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/tile-test.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/tile-test.log" | head -40
grep -E "golden \] cuda .*(int8|nf4|fp4)" "$OUT/tile-test.log" | head -8
for q in ${TILE_QUANTS:-gptq-int8 nf4}; do
    for rep in 1 2; do
        for cfg in affine4 all; do
            QINFER_QTILE=$cfg "$Q" bench --preset qwen2.5-7b --quant $q --input-lens 1 --gen 512 2>&1 | grep -E "^\| qwen" |
                sed "s/^/$cfg /" | tee -a "$OUT/tile-ab.log"
        done
    done
    QINFER_PROFILE=1 "$Q" bench --preset qwen2.5-7b --quant $q --input-lens 1 --gen 128 2>&1 | grep -E "gemv|^\| qwen" |
        grep -v lm_head | tee -a "$OUT/tile-ab.log"
    rm -rf "${QINFER_CACHE:-$HOME/.cache/qinfer}"/synth/*
done
