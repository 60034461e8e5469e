# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The int8 and fp8 decode attention at 7B's shapes (CudaDecodeTimings.Qwen7BQuantCaches: cp.async with its
# dequantization pass, and the raw-code kernel of attention_decode_q8.cu), then ncu of one raw-code int8 launch at
# Q8_NCU_LEN keys (default 129024): speed of light, memory, occupancy, stalls, instruction mix and per-instruction
# samples (SASS).
build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.Qwen7BQuantCaches' 2>&1 | grep -E "^\[ kernel \]|FAILED" | tee -a "$OUT/q8-ncu.log"
if command -v ncu >/dev/null; then
    QINFER_DECODE_TIMING_LEN=${Q8_NCU_LEN:-129024} timeout 240 ncu --clock-control none -k "regex:attention_decode_q8" --launch-skip 10 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section LaunchStats --section InstructionStats --section SourceCounters -f -o /tmp/q8-ncu \
        build-device/tests/qinfer_tests --gtest_filter='CudaDecodeTimings.Qwen7BQuantCaches' >"$OUT/q8-ncu-run.txt" 2>&1
    ncu -i /tmp/q8-ncu.ncu-rep --page details >"$OUT/q8-ncu.txt" 2>&1
    ncu -i /tmp/q8-ncu.ncu-rep --page source --csv --print-source sass 2>&1 | gzip >"$OUT/q8-ncu-sass.csv.gz"
    grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slot|No Eligible|Executed Ipc" \
        "$OUT/q8-ncu.txt" | head -30
fi
