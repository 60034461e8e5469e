# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# ncu of the bf16 decode attention at DECODE_NCU_LEN keys (default 129024, 7B's shapes, caches of several layers in
# turn): speed of light, memory workload, warp stall reasons, and per-instruction stall samples (SASS) of one launch
# after the warm-up. DECODE_NCU_KERNEL: the kernel's name pattern, attention_decode_tma (default: the tensor-copy
# kernel, sm_90a's default for bf16 caches) or attention_decode_tc (the cp.async one).
len=${DECODE_NCU_LEN:-129024}
QINFER_DECODE_TIMING_LEN=$len build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.Qwen7BShapes' 2>&1 |
    grep -E "^\[ kernel \]" | tee -a "$OUT/decode-ncu.log"
ncu_decode decode-ncu "${DECODE_NCU_KERNEL:-attention_decode_tma}" 40 "$len" CudaDecodeTimings.Qwen7BShapes \
    SpeedOfLight MemoryWorkloadAnalysis MemoryWorkloadAnalysis_Tables Occupancy WarpStateStats SchedulerStats LaunchStats SourceCounters
