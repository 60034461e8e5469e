# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The warp-specialised prefill attention (attention_prefill_tma.cu): the attention tests (every prefill kernel against
# the CPU, timings at 4097 and 129024 keys), the goldens and batch tests with QINFER_PREFILL_ATTN=$TMA_AB_FORCE (default
# tma), then time to first token alternated over QINFER_PREFILL_ATTN=$TMA_AB_VALUES (default "wgmma tma"; TMA_AB_SPECS,
# AB_GEN tokens; Qwen2.5-7B with YaRN at 129024 once each).
build-device/tests/qinfer_tests --gtest_filter='Lengths/Attention.*:LongContext/Attention.*' >"$OUT/tma-attn-test.log" 2>&1
note "attention tests with the TMA kernel: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/tma-attn-test.log" | tr '\n' ' ')"
grep -E "^\[ kernel \] attention_prefill" "$OUT/tma-attn-test.log"
grep -E "Failure" -A6 "$OUT/tma-attn-test.log" | head -40
QINFER_PREFILL_ATTN=${TMA_AB_FORCE:-tma} build-device/tests/qinfer_tests --gtest_filter='*GoldenCuda*:*Batch*' >"$OUT/tma-goldens.log" 2>&1
note "goldens and batches with QINFER_PREFILL_ATTN=${TMA_AB_FORCE:-tma}: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/tma-goldens.log" | tr '\n' ' ')"
AB_GEN=${AB_GEN:-256} ab QINFER_PREFILL_ATTN "${TMA_AB_VALUES:-wgmma tma}" "${TMA_AB_SPECS:-qwen2.5-7b:bf16:30720 qwen2.5-0.5b:bf16:30720}" tma-ab
AB_REPS=1 AB_GEN=64 ab QINFER_PREFILL_ATTN "${TMA_AB_VALUES:-wgmma tma}" "${TMA_LONG_SPECS:-qwen2.5-7b-yarn:bf16:129024}" tma-long
