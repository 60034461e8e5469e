# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# ncu of the bf16 decode attention at DECODE_NCU_LEN keys (default 129024, 7B's shapes, caches of several layers in
# turn): speed of light, memory workload, warp stall reasons, and per-instruction stall samples (SASS) of one launch
# after the warm-up. DECODE_NCU_KERNEL: the kernel's name pattern, attention_decode_tma (default: the tensor-copy
# kernel, sm_90a's default for bf16 caches) or attention_decode_tc (the cp.async one).
len=${DECODE_NCU_LEN:-129024}
QINFER_DECODE_TIMING_LEN=$len build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.Qwen7BShapes' 2>&1 |
    grep -E "^\[ kernel \]" | tee -a "$OUT/decode-ncu.log"
if command -v ncu >/dev/null; then
    QINFER_DECODE_TIMING_LEN=$len timeout 240 ncu --clock-control none -k "regex:${DECODE_NCU_KERNEL:-attention_decode_tma}" --launch-skip 40 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section Occupancy \
        --section WarpStateStats --section SchedulerStats --section LaunchStats --section SourceCounters -f -o /tmp/decode-ncu \
        build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.Qwen7BShapes' >"$OUT/decode-ncu-run.txt" 2>&1
    ncu -i /tmp/decode-ncu.ncu-rep --page details >"$OUT/decode-ncu.txt" 2>&1
    ncu -i /tmp/decode-ncu.ncu-rep --page source --csv --print-source sass 2>&1 | gzip >"$OUT/decode-ncu-sass.csv.gz"
    grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slot|No Eligible" \
        "$OUT/decode-ncu.txt" | head -30
fi
