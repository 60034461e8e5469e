# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Where the wgmma prefill kernel's time goes: ncu on its first launch at 4097 keys (d 128, 14/2 heads, bf16 cache):
# speed of light, occupancy, warp stall reasons, and per-instruction stall samples (SASS, gzip).
command -v ncu >/dev/null || return 0
timeout 200 ncu --clock-control none -k "regex:attention_prefill_wgmma_kernel" --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section SourceCounters \
    -f -o /tmp/attn-wgmma build-device/tests/qinfer_tests --gtest_filter='Lengths/Attention.*/15' >"$OUT/attn-profile.err" 2>&1
ncu -i /tmp/attn-wgmma.ncu-rep --page details >"$OUT/attn-profile-details.txt" 2>&1
ncu -i /tmp/attn-wgmma.ncu-rep --page raw --csv 2>&1 | gzip >"$OUT/attn-profile-raw.csv.gz"
ncu -i /tmp/attn-wgmma.ncu-rep --page source --csv --print-source sass 2>&1 | gzip >"$OUT/attn-profile-sass.csv.gz"
grep -E "Duration|Compute \(SM\) Throughput|Achieved Occupancy|Warp Cycles Per Issued|Registers|Issue Slots Busy" "$OUT/attn-profile-details.txt" | head -12
