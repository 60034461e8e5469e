# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Prefill pass length at the longest rows: QINFER_PREFILL_CHUNK=0 (the rule of model/prefill_chunk.h: 4096 tokens at
# 129024 + 2048) against CHUNK_LONG_VALUES (default 8192), alternated, Qwen2.5-7B with YaRN, BF16 and GPTQ-Int4
# weights, AB_GEN (default 64) tokens generated: time to first token and peak memory.
AB_REPS=${AB_REPS:-1} AB_GEN=${AB_GEN:-64} ab QINFER_PREFILL_CHUNK "0 ${CHUNK_LONG_VALUES:-8192}" \
    "${CHUNK_LONG_SPECS:-qwen2.5-7b-yarn:bf16:129024 qwen2.5-7b-yarn:gptq-int4:129024}" chunk-long
