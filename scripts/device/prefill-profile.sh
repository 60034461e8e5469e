# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Where the first token's time goes: per-op GPU time of the prefill (QINFER_PROFILE=1; PREFILL_PROFILE_SPECS
# preset:quant:length), 16 tokens generated.
for spec in ${PREFILL_PROFILE_SPECS:-qwen2.5-7b:bf16:30720 qwen2.5-7b:gptq-int4:30720}; do
    IFS=: read -r p q lens <<<"$spec"
    echo "-- $p $q $lens" | tee -a "$OUT/prefill-profile.log"
    QINFER_PROFILE=1 "$Q" bench --preset $p --quant $q --input-lens $lens --gen 16 2>&1 | grep -E "^  |profile" | tee -a "$OUT/prefill-profile.log"
done
