# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# Where a captured decode step's time goes, kernel by kernel, with programmatic dependent launch as in a real run:
# `qinfer bench --trace` (CUPTI records of every kernel, graph nodes included; TRACE_GEN generated, default 64) for each
# TRACE_SPECS entry preset:quant[:input length[:KV dtype[:VAR=value,...[:batch]]]] (default input 1, the default cache,
# no settings, one sequence; default entries 0.5B / 1.5B / 7B BF16, 7B GPTQ-Int4); the settings apply to that run only.
# Everything past the quantization names the run's files. scripts/trace_step.py prints each kernel's duration and
# exposed time (its end minus the end of the kernel before) over the last 16 steps. The speed of the traced run is
# printed too: CUPTI's overhead is the difference to an untraced row. TRACE_ARGS: more bench options for every run (e.g.
# --load-format dummy).
for spec in ${TRACE_SPECS:-qwen2.5-0.5b:bf16 qwen2.5-1.5b:bf16 qwen2.5-7b:bf16 qwen2.5-7b:gptq-int4}; do
    IFS=: read -r preset quant len kv settings batch <<<"$spec"
    tag=trace-${spec//[:=,]/-}
    # shellcheck disable=SC2086  # the settings and TRACE_ARGS split into words on purpose
    env ${settings//,/ } "$Q" bench --preset "$preset" --quant "$quant" --input-lens "${len:-1}" ${kv:+--kv-dtype "$kv"} \
        ${batch:+--batch "$batch"} --gen "${TRACE_GEN:-64}" ${TRACE_ARGS:-} --trace "/tmp/$tag.csv" 2>&1 | grep -E "^\| qwen|traced|error" | tee -a "$OUT/decode-trace.log"
    if [[ -s /tmp/$tag.csv ]]; then
        gzip -c "/tmp/$tag.csv" >"$OUT/$tag.csv.gz"
        echo "-- $spec" | tee -a "$OUT/decode-trace.log"
        python3 scripts/trace_step.py "/tmp/$tag.csv" 16 2>&1 | tee -a "$OUT/decode-trace.log"
    else
        note "decode-trace $spec: no trace written"
    fi
done
