# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# Hardware counters (ncu) of one launch of a named kernel inside a gtest: NCU_KERNEL (a regex of the kernel's name,
# required), NCU_TEST (the gtest, default CudaQuant.DecodeGemvTimings), NCU_SKIP (launches of that kernel to skip first,
# default 10), NCU_ENV (VAR=value ... for the test, e.g. QINFER_QGEMV_TIMING_CASE=GPTQ-Int4:gate_up or
# QINFER_DECODE_TIMING_LEN=129024), NCU_CMD (a qinfer command line instead of the gtest, e.g. "bench --kernels
# --models 7b --m 16"), NCU_TAG (file names, default ncu), NCU_SECTIONS (more sections, e.g. MemoryWorkloadAnalysis_Tables
# for DRAM and L2 request efficiency). Speed of light, memory, occupancy, stalls,
# instruction mix, per-instruction samples: details to $OUT/TAG.txt, SASS samples to $OUT/TAG-sass.csv.gz, their summary
# (stalls, opcodes, hottest instructions) to $OUT/TAG-summary.md.
tag=${NCU_TAG:-ncu}
if ! command -v ncu >/dev/null; then
    note "ncu: not on this machine"
elif [ -z "${NCU_KERNEL:-}" ]; then
    note "ncu: set NCU_KERNEL"
else
    sections=()
    # shellcheck disable=SC2086  # NCU_SECTIONS splits into words on purpose
    for s in SpeedOfLight MemoryWorkloadAnalysis Occupancy WarpStateStats SchedulerStats LaunchStats InstructionStats SourceCounters ${NCU_SECTIONS:-}; do
        sections+=(--section "$s")
    done
    target=(build-device/tests/qinfer_tests --gtest_filter="${NCU_TEST:-CudaQuant.DecodeGemvTimings}")
    # shellcheck disable=SC2206  # NCU_CMD splits into words on purpose
    [ -n "${NCU_CMD:-}" ] && target=("$Q" $NCU_CMD)
    # shellcheck disable=SC2086  # NCU_ENV splits into words on purpose
    env ${NCU_ENV:-} timeout 300 ncu --clock-control none -k "regex:$NCU_KERNEL" --launch-skip "${NCU_SKIP:-10}" --launch-count 1 \
        "${sections[@]}" -f -o "/tmp/$tag" "${target[@]}" >"$OUT/$tag-run.txt" 2>&1
    ncu -i "/tmp/$tag.ncu-rep" --page details >"$OUT/$tag.txt" 2>&1
    ncu -i "/tmp/$tag.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip >"$OUT/$tag-sass.csv.gz"
    grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slot|No Eligible|Executed Ipc|Block Limit|Theoretical Occ|Dynamic Shared|Waves Per SM" \
        "$OUT/$tag.txt" | head -40
    # The stall reasons of the warp-state section, largest first.
    grep -E "^ +(Stall|Warp Cycles)|est. speedup|Stall" "$OUT/$tag.txt" | head -30
    # Stall reasons over all samples, the instruction mix and the most-sampled instructions (scripts/ncu_sass_summary.py).
    python3 scripts/ncu_sass_summary.py "$OUT/$tag-sass.csv.gz" --top 12 >"$OUT/$tag-summary.md" 2>&1 && head -60 "$OUT/$tag-summary.md"
fi
