# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The 4-bit GEMV: kernels on 7B shapes with the bf16 GEMV for scale (QGEMV_KS="0 2 4": forced K splits, 0 = the
# default rule), hardware counters of the qkv and gate_up kernels, a decode-step profile of 7B GPTQ-Int4.
for ks in ${QGEMV_KS:-0}; do
    echo "-- QINFER_QKS=$ks"
    QINFER_QKS=$ks build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' 2>&1 |
        grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/qgemv.log"
done
if command -v ncu >/dev/null; then
    for re in GemvOutE0 GemvOutE3; do
        timeout 120 ncu --clock-control none --kernel-name-base mangled -k "regex:qgemv_ring_kernel.*$re" --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
            build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' >"$OUT/ncu-ring-$re.txt" 2>&1
        grep -E "Memory Throughput|DRAM Throughput|Duration|Achieved Occupancy|Warp Cycles Per Issued" "$OUT/ncu-ring-$re.txt" | head -14
    done
fi
QINFER_PROFILE=1 "$Q" bench --preset qwen2.5-7b --quant gptq-int4 --input-lens 1 --gen 256 2>&1 | tee "$OUT/profile-7b-int4.log" | grep -E "gemv|attention|norm|^\| qwen"
