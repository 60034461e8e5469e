# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Hardware counters of the quantized decode GEMVs on 7B's shapes (m 1), one launch each, from
# CudaQuant.DecodeGemvTimings with QINFER_QGEMV_TIMING_CASE: GPTQ-Int4 gate_up (ring of 6), GPTQ-Int4 down (the deep
# ring, the default for 4-bit: launches after the plain ring's 203), GPTQ-Int8 gate_up, and the bf16 gate_up GEMV
# for scale. Speed of light, memory, occupancy, stalls, instruction mix, per-instruction samples (SASS).
sections=(SpeedOfLight MemoryWorkloadAnalysis Occupancy WarpStateStats SchedulerStats LaunchStats InstructionStats SourceCounters)
for spec in "GPTQ-Int4:gate_up qgemv_ring_kernel 10 int4-gate-up" "GPTQ-Int4:down qgemv_ring_kernel 215 int4-down" \
    "GPTQ-Int8:gate_up qgemv_ring_kernel 10 int8-gate-up" "GPTQ-Int4:gate_up gemv_kernel 10 bf16-gate-up"; do
    read -r case kernel skip tag <<<"$spec"
    echo "-- $tag ($case, $kernel)"
    QINFER_QGEMV_TIMING_CASE=$case build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' 2>&1 |
        grep -E "^\[ kernel \]" | tee -a "$OUT/qgemv-ncu.log"
    QINFER_QGEMV_TIMING_CASE=$case ncu_decode "ncu-$tag" "$kernel" "$skip" 0 CudaQuant.DecodeGemvTimings "${sections[@]}"
done
