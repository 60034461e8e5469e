# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# The MoE rows of issue 35 with this tree's binary: each MOE_SPECS entry preset:quant:input lengths:batches:load format
# (default qwen1.5-moe-a2.7b:bf16:1:1,16,64:synth; load format synth = a synthesized checkpoint read from disk, dummy =
# --load-format dummy, random weights built in memory, for models larger than the disk), MOE_GEN generated (default
# 2048), with --past-context (harmless within the context; the seeds run Qwen1.5-MoE-A2.7B, 8192 positions, at 30720).
# Rows to $OUT/moe.log, JSON per entry. MOE_SPEC_TIMEOUT: seconds one entry may run (default 300; a wrong entry, such as
# input 30720 at batch 64, once ran a whole call past its limit and took the call's other results with it).
for spec in ${MOE_SPECS:-qwen1.5-moe-a2.7b:bf16:1:1,16,64:synth}; do
    IFS=: read -r p q lens batches load <<<"$spec"
    load_args=()
    [ "${load:-synth}" = dummy ] && load_args=(--load-format dummy)
    echo "== $spec" | tee -a "$OUT/moe.log"
    timeout "${MOE_SPEC_TIMEOUT:-300}" "$Q" bench --preset "$p" --quant "$q" --input-lens "$lens" --batch "${batches:-1}" --gen "${MOE_GEN:-2048}" --past-context \
        "${load_args[@]}" --json "$OUT/moe-${spec//[:,]/-}.json" 2>&1 | grep -E "^\| [^M-]|^card|error" | tee -a "$OUT/moe.log"
done
