# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The ring GEMV's fast rounds (qgemv_ring.cuh: no bounds checks and one group check per K block in the rounds whose
# refills stay inside the part; normalised inputs staged in pair order for two 16-byte B loads per block) against the
# checked loop for every round: the quantized GEMV and golden tests under the default, the decode GEMV timings of 7B's
# shapes under QINFER_QRING_FAST=0 (never) and =1 (wherever the kernel can take them), then rows for QRING_SPECS under
# QRING_VALUES (default "0 1"; -1 is the default rule: parts of three rounds) alternated AB_REPS times (default 2).
build-device/tests/qinfer_tests --gtest_filter='OddShapes/QuantGemv.*:CudaQuant.*:*GoldenCuda*-*Timings*' >"$OUT/qring-fast-tests.log" 2>&1
note "quantized GEMV / golden tests, fast rounds: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/qring-fast-tests.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/qring-fast-tests.log" | head -30
for v in 0 1; do
    QINFER_QRING_FAST=$v build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' 2>&1 |
        grep -E "^\[ kernel \] qgemv" | sed "s/^/fast=$v /" | tee -a "$OUT/qring-fast-kernels.log"
done
ab QINFER_QRING_FAST "${QRING_VALUES:-0 1}" "${QRING_SPECS:-qwen2.5-7b:gptq-int4:1 qwen2.5-0.5b:gptq-int4:1}" qring-fast
