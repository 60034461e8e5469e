# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The 4-bit ring GEMV's launch knobs on 7B's shapes (m 1, CudaQuant.DecodeGemvTimings, one case per run): K parts per
# row block forced (QINFER_QKS) and codes asked into L2 ahead of the ring (QINFER_QGEMV_L2AHEAD), for the cases in
# QKNOB_CASES (default GPTQ-Int4 gate_up and qkv); then ncu (stall reasons, per-instruction samples) of Int4 gate_up
# at the defaults. Question: whether gate_up, which takes ~29.6 us a layer on both an H100 and an H200
# (bench/results/2026-11-28-h200-3ca90f2), is held back by its grid (296 blocks over 132 SMs x 3 slots) or inside
# each warp.
for case in ${QKNOB_CASES:-GPTQ-Int4:gate_up GPTQ-Int4:qkv}; do
    for setting in "default" "QINFER_QKS=1" "QINFER_QKS=2" "QINFER_QKS=4" "QINFER_QGEMV_L2AHEAD=6"; do
        envs=""; [ "$setting" = default ] || envs=$setting
        # shellcheck disable=SC2086  # one VAR=value word
        env $envs QINFER_QGEMV_TIMING_CASE=$case build-device/tests/qinfer_tests --gtest_filter='CudaQuant.DecodeGemvTimings' 2>&1 |
            grep -E "^\[ kernel \] qgemv" | sed "s/^/$setting /" | tee -a "$OUT/qgemv-knobs.log"
    done
done
sections=(SpeedOfLight MemoryWorkloadAnalysis Occupancy WarpStateStats SchedulerStats LaunchStats InstructionStats SourceCounters)
QINFER_QGEMV_TIMING_CASE=GPTQ-Int4:gate_up ncu_decode ncu-int4-gate-up qgemv_ring_kernel 10 0 CudaQuant.DecodeGemvTimings "${sections[@]}"
grep -E "Stall|stall" "$OUT/ncu-int4-gate-up.txt" | head -40
