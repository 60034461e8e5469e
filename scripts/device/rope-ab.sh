# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The QKV GEMV with bias/RoPE/cache store fused (default) against the two kernels (QINFER_FUSED_ROPE=0), alternated:
# the CUDA op tests (the fused kernel's among them) and the end-to-end GPU tests, then decode speed (ROPE_AB_SPECS preset:lengths) under each.
build-device/tests/qinfer_tests --gtest_filter='CudaOps.*:*GoldenCuda*:*Batch*:*KvBackends*:*ArgmaxRows*' >"$OUT/rope-test.log" 2>&1
note "fused rope, ops, golden, batch tests: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/rope-test.log" | tr '\n' ' ')"
grep -E "Failure" -A6 "$OUT/rope-test.log" | head -20
for spec in ${ROPE_AB_SPECS:-qwen2.5-0.5b:1 qwen2.5-1.5b:1 qwen2.5-7b:1}; do
    for fr in 0 1 0 1; do
        QINFER_FUSED_ROPE=$fr "$Q" bench --preset ${spec%%:*} --input-lens ${spec##*:} --gen 2048 \
            --json "$OUT/rope-ab-${spec%%:*}-$fr-$RANDOM.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/fused $fr /" | tee -a "$OUT/rope-ab.log"
    done
done
