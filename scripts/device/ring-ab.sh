# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Decode GEMV prologue and codes prefetch: RMSNorm staging in float4 batches (default) vs the per-256 loop
# (QINFER_QSTAGE=scalar), and 4-bit codes requested into L2 ahead of the ring kernel's registers
# (QINFER_QGEMV_L2AHEAD blocks): kernel timings on 7B shapes, the quantized/GEMV tests with the prefetch on, and
# decode speed of 7B/0.5B (Int4 and BF16), configurations alternated in the same run.
for cfg in ${RING_CFGS:-scalar:0 vec:0 vec:6 vec:12 vec:24}; do
    echo "-- stage ${cfg%%:*} l2-ahead ${cfg##*:}"
    QINFER_QSTAGE=${cfg%%:*} QINFER_QGEMV_L2AHEAD=${cfg##*:} build-device/tests/qinfer_tests \
        --gtest_filter='CudaQuant.DecodeGemvTimings' 2>&1 | grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/ring-ab.log"
done
QINFER_QGEMV_L2AHEAD=${TEST_AHEAD:-12} build-device/tests/qinfer_tests --gtest_filter='*Quant*:*Gemv*:*GoldenCuda*' >"$OUT/ring-test.log" 2>&1
note "quant/gemv/golden tests (vec staging, l2 ahead ${TEST_AHEAD:-12}): $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/ring-test.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/ring-test.log" | head -40
for rep in 1 2; do
    for spec in ${RING_BENCH:-qwen2.5-7b:gptq-int4 qwen2.5-0.5b:gptq-int4}; do
        for cfg in ${RING_BENCH_CFGS:-scalar:0 vec:0 vec:12}; do
            QINFER_QSTAGE=${cfg%%:*} QINFER_QGEMV_L2AHEAD=${cfg##*:} "$Q" bench --preset ${spec%%:*} --quant ${spec##*:} \
                --input-lens 1 --gen 512 2>&1 | grep -E "^\| qwen" | sed "s/^/$cfg /" | tee -a "$OUT/ring-ab.log"
        done
    done
    for spec in ${BF16_BENCH:-qwen2.5-0.5b qwen2.5-1.5b qwen2.5-7b}; do
        for st in scalar vec; do
            QINFER_QSTAGE=$st "$Q" bench --preset $spec --input-lens 1 --gen 512 2>&1 | grep -E "^\| qwen" | sed "s/^/$st /" |
                tee -a "$OUT/ring-ab.log"
        done
    done
done
