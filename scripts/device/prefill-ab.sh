# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
# Prefill attention kernels end to end: QINFER_PREFILL_ATTN=pipelined (mma.sync) against the default (=auto: wgmma
# where it runs), alternated, at 30720 (time to first token and speed incl. prefill). The runs of this session's results
# (12ba010..506c63c) were labelled "wgmma": the default at 12ba010 and 29e214f, a forcing value at 506c63c (since
# removed); each ran the wgmma kernel.
for spec in ${PREFILL_AB_SPECS:-qwen2.5-0.5b:30720 qwen2.5-7b:30720}; do
    p=${spec%%:*} lens=${spec##*:}
    n_ab=0
    for k in pipelined auto pipelined auto; do
        n_ab=$((n_ab + 1))  # (not inside the pipeline: its commands run in subshells)
        QINFER_PREFILL_ATTN=$k "$Q" bench --preset $p --input-lens $lens --gen ${PREFILL_AB_GEN:-2048} \
            --json "$OUT/prefill-ab-$p-$k-$n_ab.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/attn=$k /" | tee -a "$OUT/prefill-ab.log"
    done
done
