# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# An A/B of an environment switch (made for decode attention; any knob the binary reads works): DAB_VAR=value for each
# of DAB_VALUES (default "0 1"), alternated DAB_ROUNDS times (default 2). Each round: the decode kernel timings
# (DAB_TIMINGS, a gtest filter, default CudaDecodeTimings.*: 7B bf16, int8, fp8 caches and 0.5B shapes; a filter that
# matches nothing skips them), then each DAB_SPECS row (preset:quant:kv-dtype:input lengths; default 7B YaRN GPTQ-Int4
# at 129024 with an int8 and a bf16 cache; a blank " " runs none) by `qinfer bench` with DAB_ARGS (default --load-format
# dummy; static batches by --batch there). Logs to $OUT/decode-ab.log, JSON per row and arm, a table of tok/s, decode
# tok/s and time to first token per arm last.
for r in $(seq "${DAB_ROUNDS:-2}"); do
    for v in ${DAB_VALUES:-0 1}; do
        env "$DAB_VAR=$v" build-device/tests/qinfer_tests --gtest_filter="${DAB_TIMINGS:-CudaDecodeTimings.*}" 2>&1 |
            grep -E "^\[ kernel \]" | sed "s/^/$DAB_VAR=$v r$r: /" | tee -a "$OUT/decode-ab.log"
        for spec in ${DAB_SPECS:-qwen2.5-7b-yarn:gptq-int4:int8:129024 qwen2.5-7b-yarn:gptq-int4:bf16:129024}; do
            IFS=: read -r p q kv lens <<<"$spec"
            # shellcheck disable=SC2086  # DAB_ARGS splits into words on purpose
            env "$DAB_VAR=$v" "$Q" bench --preset "$p" --quant "$q" --kv-dtype "$kv" --input-lens "$lens" ${DAB_ARGS:---load-format dummy} \
                --json "$OUT/dab-$v-$p-$q-kv$kv-in${lens//,/_}-$r.json" 2>&1 | grep -E "^\| qwen" | sed "s/^/$DAB_VAR=$v r$r $kv: /" | tee -a "$OUT/decode-ab.log"
        done
    done
done
echo "-- decode-ab: $DAB_VAR, rows per arm (tok/s with prefill, decode tok/s, time to first token)"
python3 - "$OUT" <<'PY'
import collections, glob, json, re, sys
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(sys.argv[1] + "/dab-*.json")):
    arm = re.match(r"dab-(.*?)-(?:qwen|llama)", f.rsplit("/", 1)[1]).group(1)  # a value may hold '-' (-1)
    kv = f.rsplit("-kv", 1)[1].split("-")[0]
    data = json.load(open(f))
    for r in data if isinstance(data, list) else data.get("rows", []):
        rows[(r.get("model", "?"), r.get("quant", ""), kv, r.get("input_len"), r.get("batch", 1))][arm].append(
            (r.get("tok_s"), r.get("decode_tok_s"), r.get("ttft_s")))
print("| model | quant | kv | input | batch | arm | tok/s | decode tok/s | TTFT s |")
print("|---|---|---|---|---|---|---|---|---|")
for (m, q, kv, n, b), arms in rows.items():
    for arm, v in sorted(arms.items()):
        print(f"| {m} | {q} | {kv} | {n} | {b} | {arm} | {' / '.join(f'{a:.2f}' for a, _, _ in v if a)} "
              f"| {' / '.join(f'{d:.2f}' for _, d, _ in v if d)} | {' / '.join(f'{t:.3f}' for _, _, t in v if t is not None)} |")
PY
