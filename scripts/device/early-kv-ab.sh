# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# The decode attention's block table and first key tiles requested before pdl_wait (QINFER_DECODE_EARLY_KV=1): the
# goldens with it on (graphs under PDL), then each model alternated off / on.
QINFER_DECODE_EARLY_KV=1 build-device/tests/qinfer_tests --gtest_filter='*GoldenCuda*' >"$OUT/early-kv-goldens.log" 2>&1
note "goldens with early KV: $(grep -E '^\[  PASSED  \]|FAILED TEST' "$OUT/early-kv-goldens.log" | tr '\n' ' ')"
ab QINFER_DECODE_EARLY_KV "0 1" "${EARLY_KV_SPECS:-qwen2.5-0.5b:bf16:1 qwen2.5-1.5b:bf16:1 qwen2.5-7b:bf16:1,30720 qwen2.5-0.5b:gptq-int4:1}" early-kv-ab
