# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# Where a long prompt's prefill time goes, kernel by kernel: `qinfer bench --trace` with PT_GEN generated tokens
# (default 4, so that the run is nearly all prefill) for each PT_SPECS entry preset:quant:input length[:VAR=value,...]
# (default Qwen2-57B-A14B GPTQ-Int4 at 30720), --load-format dummy and PT_ARGS; scripts/trace_totals.py then sums each
# kernel's time, its template arguments kept (--templates), the top PT_TOP (default 30); scripts/trace_passes.py the
# passes' wall, attention and GEMM times (every PT_EVERY-th pass, default 4).
for spec in ${PT_SPECS:-qwen2-57b-a14b:gptq-int4:30720}; do
    IFS=: read -r preset quant len settings <<<"$spec"
    tag=prefill-${spec//[:=,]/-}
    # shellcheck disable=SC2086  # the settings and PT_ARGS split into words on purpose
    env ${settings//,/ } "$Q" bench --preset "$preset" --quant "$quant" --input-lens "$len" --gen "${PT_GEN:-4}" --load-format dummy ${PT_ARGS:-} \
        --trace "/tmp/$tag.csv" 2>&1 | grep -E "^\| qwen|traced|error" | tee -a "$OUT/prefill-trace.log"
    if [[ -s /tmp/$tag.csv ]]; then
        gzip -c "/tmp/$tag.csv" >"$OUT/$tag.csv.gz"
        echo "-- $spec" | tee -a "$OUT/prefill-trace.log"
        python3 scripts/trace_totals.py "/tmp/$tag.csv" "${PT_TOP:-30}" --templates 2>&1 | tee -a "$OUT/prefill-trace.log"
        python3 scripts/trace_passes.py "/tmp/$tag.csv" --every "${PT_EVERY:-4}" 2>&1 | tee -a "$OUT/prefill-trace.log"
    else
        note "prefill-trace $spec: no trace written"
    fi
done
