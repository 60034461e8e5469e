# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# Continuous batching against vLLM's benchmark_throughput rows (the serving issue): TP_SPECS entries
# preset:input:output:prompts[:max-batch-tokens[:max-num-seqs]] (default 7B 100/250 and 1000/100, 0.5B 100/250, 1000 prompts each),
# then transformers' generate_batch on the same weights and card (HF_TP_SPECS preset:input:output:prompts, default
# 7B 100/250 with 200 prompts: it runs ~15x slower) for the ratio. TP_ARGS: more options for every qinfer row.
# TP_TRACE_SPECS (same form, default none): a traced run each first, summed up by scripts/trace_totals.py.
# TP_RUN_TIMEOUT: seconds each qinfer run may take (default 900).
# TP_AB_SPECS (same form): each run by the baseline binary of the ab stage (build-base/qinfer) and this tree's,
# alternated, rows prefixed base / this.

# `bench --throughput` of one spec by the binary $1, then any more options.
tp_run() {
    local bin=$1 spec=$2 p i o n mbt mns
    shift 2
    IFS=: read -r p i o n mbt mns <<<"$spec"
    # shellcheck disable=SC2086  # TP_ARGS splits into words on purpose
    timeout -k 10 "${TP_RUN_TIMEOUT:-900}" "$bin" bench --throughput --preset "$p" --num-prompts "$n" --input-len "$i" --output-len "$o" ${mbt:+--max-batch-tokens "$mbt"} \
        ${mns:+--max-num-seqs "$mns"} ${TP_ARGS:-} "$@"
}
# A spec's part of file names: preset-input-output-prompts[-mbtN][-mnsN].
tp_tag() {
    local p i o n mbt mns
    IFS=: read -r p i o n mbt mns <<<"$1"
    echo "$p-$i-$o-$n${mbt:+-mbt$mbt}${mns:+-mns$mns}"
}
for spec in ${TP_TRACE_SPECS:-}; do
    tag=trace-tp-$(tp_tag "$spec")
    tp_run "$Q" "$spec" --trace "/tmp/$tag.csv" 2>&1 | grep -E "^Throughput|error|traced" | sed 's/^/traced: /' | tee -a "$OUT/throughput.log"
    python3 scripts/trace_totals.py "/tmp/$tag.csv" 24 2>&1 | tee -a "$OUT/throughput.log"
    gzip -c "/tmp/$tag.csv" >"$OUT/$tag.csv.gz"
done
for spec in ${TP_AB_SPECS:-}; do
    for arm in base this; do
        bin=$Q commit=${QINFER_COMMIT:-}
        [ "$arm" = base ] && bin=$PWD/build-base/qinfer commit=$(cat .ab-base/COMMIT 2>/dev/null || echo base)
        [ -x "$bin" ] || { note "throughput: no $bin"; continue; }
        QINFER_COMMIT=$commit QINFER_ASSETS=$PWD/assets tp_run "$bin" "$spec" --json "$OUT/tp-$arm-$(tp_tag "$spec").json" 2>&1 |
            grep -E "^\| qwen|error" | sed "s/^/$arm /" | tee -a "$OUT/throughput.log"
    done
done
for spec in ${TP_SPECS-qwen2.5-7b:100:250:1000 qwen2.5-7b:1000:100:1000 qwen2.5-0.5b:100:250:1000}; do
    tp_run "$Q" "$spec" --json "$OUT/tp-$(tp_tag "$spec").json" 2>&1 | grep -E "^Throughput|^\| qwen|error|^card" | tee -a "$OUT/throughput.log"
done
for spec in ${HF_TP_SPECS-qwen2.5-7b:100:250:200}; do
    IFS=: read -r p i o n <<<"$spec"
    d=${QINFER_CACHE:-$HOME/.cache/qinfer}/synth/$p-bf16  # where bench --throughput synthesized it
    [ -f "$d/config.json" ] || "$Q" synth --preset "$p" --out "$d" >/dev/null
    timeout 600 python3 scripts/hf_throughput.py "$d" --model "$p" --num-prompts "$n" --input-len "$i" --output-len "$o" \
        --out "$OUT/hf-tp-$p-$i-$o-$n.json" 2>&1 | tail -2 | tee -a "$OUT/throughput.log"
done
