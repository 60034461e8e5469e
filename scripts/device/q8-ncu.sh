# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The int8 and fp8 decode attention at 7B's shapes (CudaDecodeTimings.Qwen7BQuantCaches: cp.async with its
# dequantization pass, and the raw-code kernel of attention_decode_q8.cu), then ncu of one raw-code int8 launch at
# Q8_NCU_LEN keys (default 129024): speed of light, memory, occupancy, stalls, instruction mix and per-instruction
# samples (SASS).
build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.Qwen7BQuantCaches' 2>&1 | grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/q8-ncu.log"
ncu_decode q8-ncu attention_decode_q8 10 "${Q8_NCU_LEN:-129024}" CudaDecodeTimings.Qwen7BQuantCaches \
    SpeedOfLight MemoryWorkloadAnalysis Occupancy WarpStateStats SchedulerStats LaunchStats InstructionStats SourceCounters
