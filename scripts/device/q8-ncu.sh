# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# ncu of the raw-code int8 decode attention (attention_decode_q8.cu) at 129024 keys, 14/2 heads, d 128 (the
# QuantAttention long-context case): speed of light, memory, occupancy, stalls, instruction mix and per-instruction
# samples (SASS) of one launch.
if command -v ncu >/dev/null; then
    timeout 240 ncu --clock-control none -k "regex:attention_decode_q8" --launch-skip 4 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
        --section SchedulerStats --section LaunchStats --section InstructionStats --section SourceCounters -f -o /tmp/q8-ncu \
        build-device/tests/qinfer_tests --gtest_filter='LongContext/QuantAttention.*/1' >"$OUT/q8-ncu-run.txt" 2>&1
    ncu -i /tmp/q8-ncu.ncu-rep --page details >"$OUT/q8-ncu.txt" 2>&1
    ncu -i /tmp/q8-ncu.ncu-rep --page source --csv --print-source sass 2>&1 | gzip >"$OUT/q8-ncu-sass.csv.gz"
    grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slot|No Eligible|Executed Ipc" \
        "$OUT/q8-ncu.txt" | head -30
fi
