#!/usr/bin/env bash
# Bad input through the real binary: each case must exit non-zero (not by a signal) with one error line that
# names the problem.
set -u
q="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
passes=0

# expect NAME PATTERN CMD...: non-zero exit below 128, exactly one stderr line, matching PATTERN.
expect() {
    local name="$1" pattern="$2"
    shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    local lines
    lines=$(wc -l <"$tmp/err")
    if [ "$rc" -eq 0 ] || [ "$rc" -ge 128 ] || [ "$lines" -ne 1 ] || ! grep -q -- "$pattern" "$tmp/err"; then
        echo "FAIL $name: rc=$rc, $lines stderr lines:"
        sed 's/^/    /' "$tmp/err" | head -5
        fails=$((fails + 1))
    else
        echo "ok   $name: $(cat "$tmp/err")"
        passes=$((passes + 1))
    fi
}

good="$tmp/good"
"$q" synth --preset tiny-qwen2 --out "$good" >/dev/null || { echo "synth failed"; exit 1; }
fresh() { rm -rf "$tmp/m"; cp -r "$good" "$tmp/m"; }
st="$tmp/m/model.safetensors"

fresh; truncate -s 5000 "$st"
expect truncated-file "truncated" "$q" logits --model "$tmp/m" --tokens 1,2 --out "$tmp/x.npy"
fresh; printf '\xff\xff\xff\x00\x00\x00\x00\x00' | dd of="$st" conv=notrunc status=none
expect header-past-end "runs past the end" "$q" logits --model "$tmp/m" --tokens 1 --out "$tmp/x.npy"
fresh; python3 - "$st" <<'PY' 2>/dev/null || sed -i 's/"data_offsets":\[0,/"data_offsets":[999999999,/' "$st"
import json, struct, sys
p = sys.argv[1]; b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n]); k = [k for k in h if k != '__metadata__'][0]
h[k]['data_offsets'] = [10**9, 10**9 + h[k]['data_offsets'][1] - h[k]['data_offsets'][0]]
t = json.dumps(h).encode(); t += b' ' * ((8 - len(t) % 8) % 8)
open(p, 'wb').write(struct.pack('<Q', len(t)) + t + b[8 + n:])
PY
expect offsets-out-of-range "ends at byte" "$q" logits --model "$tmp/m" --tokens 1 --out "$tmp/x.npy"
fresh; sed -i 's/"intermediate_size": 160/"intermediate_size": 128/' "$tmp/m/config.json"
expect wrong-shape "has shape \[160, 96\], config.json implies \[128, 96\]" "$q" logits --model "$tmp/m" --tokens 1 --out "$tmp/x.npy"
fresh; sed -i 's/"model_type": "qwen2"/"model_type": "mamba"/' "$tmp/m/config.json"
expect unknown-model-type "unknown model_type 'mamba'" "$q" info --model "$tmp/m"
fresh; sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 4/' "$tmp/m/config.json"
expect missing-tensor "missing tensors: model.layers.3" "$q" info --model "$tmp/m"
fresh; sed -i 's/"num_hidden_layers": 3/"num_hidden_layers": 2/' "$tmp/m/config.json"
expect unexpected-tensor "unexpected tensors: model.layers.2" "$q" info --model "$tmp/m"
rm -rf "$tmp/s"; "$q" synth --preset tiny-qwen2 --out "$tmp/s" --shard-size 200000 >/dev/null
rm "$tmp/s/model-00002-of-"*.safetensors
expect missing-shard "missing shard model-00002-of-" "$q" info --model "$tmp/s"
fresh; rm "$tmp/m/config.json"
expect missing-config "no config.json" "$q" info --model "$tmp/m"
fresh; echo '{"model_type": "qwen2",' >"$tmp/m/config.json"
expect bad-json "not a JSON object" "$q" info --model "$tmp/m"
expect no-such-dir "not a directory" "$q" info --model "$tmp/nope"
expect token-out-of-vocab "outside the vocabulary" "$q" run --model "$good" --tokens 1,999 -n 2
expect bad-token-list "is not an integer" "$q" run --model "$good" --tokens 1,abc -n 2
expect prompt-too-long "exceeds the model's context" "$q" run --model "$good" --tokens "$(seq -s, 1 250)" -n 10
expect unknown-option "unknown option --frobnicate" "$q" info --model "$good" --frobnicate 1
expect unknown-preset "unknown preset 'qwen9'" "$q" synth --preset qwen9 --out "$tmp/z"
expect bad-top-p "top_p must be in" "$q" run --model "$good" --tokens 1 --temperature 1 --top-p 0
rm -rf "$tmp/ks"; "$q" synth --preset tiny-qwen2 --out "$tmp/ks" --kv-scale 0.5 >/dev/null
python3 - "$tmp/ks/model.safetensors" <<'PY' || echo "FAIL kv-scale-negative: could not patch the checkpoint"
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); n = struct.unpack('<Q', b[:8])[0]
h = json.loads(bytes(b[8:8 + n])); begin = h['model.layers.1.self_attn.v_scale']['data_offsets'][0]
b[8 + n + begin:8 + n + begin + 4] = struct.pack('<f', -1.0)
open(p, 'wb').write(bytes(b))
PY
expect kv-scale-negative "v_scale' is -1; an fp8 KV scale must be positive" "$q" info --model "$tmp/ks"
if ! "$q" bench --help | grep -q max-batch; then echo "FAIL bench --help: no --max-batch"; fails=$((fails + 1)); fi
expect max-batch-cpu "needs the CUDA backend" "$q" bench --preset tiny-qwen2 --backend cpu --max-batch --input-lens 8 --gen 1
expect bad-batch "--batch entries must be in 1..4096" "$q" bench --preset tiny-qwen2 --batch 0 --input-lens 1 --gen 1
expect bench-json-unwritable "--json: cannot write" "$q" bench --preset tiny-qwen2 --backend cpu --input-lens 1 --gen 1 --json "$tmp/no-such-dir/rows.json"
expect trace-cpu "--trace records GPU kernels" "$q" bench --preset tiny-qwen2 --backend cpu --input-lens 1 --gen 1 --trace "$tmp/t.csv"
# --past-context: a row past max_position_embeddings (256 for the tiny presets) runs; scaled RoPE refuses it.
if ! "$q" bench --model "$good" --backend cpu --input-lens 300 --gen 2 --past-context 2>/dev/null | grep -qE '^\| .* \| 300 \| [A-Z0-9]+ \| 0 \| [0-9]'; then
    echo "FAIL past-context: no timed row at input 300"
    fails=$((fails + 1))
fi
"$q" synth --preset tiny-qwen2-linear --out "$tmp/linear" >/dev/null
expect past-context-scaled-rope "needs plain RoPE" "$q" bench --model "$tmp/linear" --backend cpu --input-lens 600 --gen 2 --past-context

# --load-format dummy: a config folder without weights runs and its rows say so; without the option it fails in one line.
expect load-format-unknown "--load-format must be auto or dummy" "$q" bench --preset tiny-qwen2 --backend cpu --input-lens 1 --gen 1 --load-format fast
"$q" synth --preset tiny-qwen2-moe --config-only --out "$tmp/cfg" >/dev/null
if ! "$q" bench --model "$tmp/cfg" --load-format dummy --backend cpu --input-lens 4 --gen 2 --json "$tmp/dummy.json" >/dev/null 2>&1 ||
    ! grep -q '"load_format": "dummy"' "$tmp/dummy.json"; then
    echo "FAIL load-format-dummy: no row with load_format dummy"
    fails=$((fails + 1))
fi
expect config-only-no-weights "no model.safetensors" "$q" logits --model "$tmp/cfg" --tokens 1 --out "$tmp/x.npy"

# Plots of benchmark JSON.
echo '[{"model": "m", "quant": "BF16", "kv_dtype": "bf16", "batch": 1, "input_len": 1, "tok_s": 5}]' >"$tmp/rows.json"
expect plot-missing-json "cannot open" "$q" plot --json "$tmp/none.json" --out "$tmp/p.png"
echo '{"a": 1' >"$tmp/bad.json"
expect plot-bad-json "not a JSON array of bench rows" "$q" plot --json "$tmp/bad.json" --out "$tmp/p.png"
if "$q" plot --json "$tmp/rows.json" --out "$tmp/p.png" 2>/dev/null; then
    expect plot-bad-y "y must be tok_s" "$q" plot --json "$tmp/rows.json" --out "$tmp/p.png" --y speed
    expect plot-no-rows "no rows with numeric input_len and peak_gb" "$q" plot --json "$tmp/rows.json" --out "$tmp/p.png" --y peak_gb
    expect plot-unwritable "cannot write" "$q" plot --json "$tmp/rows.json" --out "$tmp/nodir/p.png"
    if [ "$(head -c 4 "$tmp/p.png" | od -An -c | tr -d ' ')" = '211PNG' ]; then
        echo "ok   plot-writes-png"; passes=$((passes + 1))
    else
        echo "FAIL plot-writes-png: no PNG signature"; fails=$((fails + 1))
    fi
    # `bench --bandwidth --json` files: rows under a header, one line per probe, x in MB.
    echo '{"card": "x", "rows": [{"probe": "loads", "bytes": 8000000, "us": 10, "tb_per_s": 0.8},
          {"probe": "loads", "bytes": 70000000, "us": 23, "tb_per_s": 3.0}]}' >"$tmp/bw.json"
    if "$q" plot --json "$tmp/bw.json" --out "$tmp/bw.png" --x mb --y tb_per_s 2>/dev/null && [ -s "$tmp/bw.png" ]; then
        echo "ok   plot-bandwidth-rows"; passes=$((passes + 1))
    else
        echo "FAIL plot-bandwidth-rows: no PNG from bench --bandwidth rows"; fails=$((fails + 1))
    fi
    expect plot-bad-x "x must be input_len, batch or mb" "$q" plot --json "$tmp/bw.json" --out "$tmp/bw.png" --x size
else
    expect plot-without-libgd "built without libgd" "$q" plot --json "$tmp/rows.json" --out "$tmp/p.png"
fi

# Memory tables from bench rows.
echo '[{"model": "m", "quant": "BF16", "kv_dtype": "bf16", "batch": 4, "input_len": 1, "gen_len": 8, "peak_gb": 16.0},
       {"model": "m", "quant": "BF16", "kv_dtype": "int8", "batch": 4, "input_len": 1, "gen_len": 8, "peak_gb": 15.5}]' >"$tmp/mem.json"
if "$q" memory-table --json "$tmp/mem.json" | grep -q '| 4 | 16.00 | 15.50 | 0.50 | 3% |'; then
    echo "ok   memory-table"; passes=$((passes + 1))
else
    echo "FAIL memory-table: $("$q" memory-table --json "$tmp/mem.json" 2>&1 | tail -3)"; fails=$((fails + 1))
fi
expect memory-table-no-rows "no bench rows with peak_gb and input_len" "$q" memory-table --json "$tmp/rows.json" --by input_len
expect memory-table-bad-by "--by must be batch or input_len" "$q" memory-table --json "$tmp/mem.json" --by gen

# Quantized checkpoints whose tensors or config are wrong.
gq="$tmp/gq"
"$q" synth --preset tiny-qwen2 --out "$gq" --quant gptq-int4 --group-size 32 >/dev/null || { echo "synth --quant failed"; exit 1; }
qfresh() { rm -rf "$tmp/m"; cp -r "$gq" "$tmp/m"; rm -f "$tmp/m/quantize_config.json"; }
qfresh; sed -i 's/"bits": 4/"bits": 5/' "$tmp/m/config.json"
expect gptq-bad-bits "5-bit GPTQ is not supported" "$q" info --model "$tmp/m"
qfresh; sed -i 's/"group_size": 32/"group_size": 64/' "$tmp/m/config.json"
expect gptq-group-mismatch "qzeros' has shape \[3, 12\], config.json and its quantization config imply \[2, 12\]" "$q" info --model "$tmp/m"
qfresh; sed -i 's/"quant_method": "gptq"/"quant_method": "exl2"/' "$tmp/m/config.json"
expect unknown-quant-method "quant_method 'exl2' is not supported" "$q" info --model "$tmp/m"
qfresh; sed -i 's/"checkpoint_format": "gptq"/"checkpoint_format": "marlin"/' "$tmp/m/config.json"
expect gptq-marlin-format "checkpoint_format 'marlin' is not supported" "$q" info --model "$tmp/m"
qfresh; python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); del c['quantization_config']; json.dump(c, open(p,'w'))" "$tmp/m/config.json"
expect quant-config-missing "has .qweight but no quantization config" "$q" info --model "$tmp/m"
qfresh; truncate -s 20000 "$tmp/m/model.safetensors"
expect quant-truncated "truncated" "$q" info --model "$tmp/m"

# qinfer serve: refused before it listens.
expect serve-no-model "missing option --model" "$q" serve
expect serve-bad-port "port must lie in" "$q" serve --model "$good" --port 70000
expect serve-no-tokenizer "no tokenizer.json\|without cpp-httplib" "$q" serve --model "$good" --port 0
expect serve-bad-queue "max-queue must be >= 0" "$q" serve --model "$good" --max-queue -1
expect throughput-no-prompts "must be >= 1" "$q" bench --throughput --model "$good" --num-prompts 0
expect throughput-too-long "does not fit: one request may hold" "$q" bench --throughput --model "$good" --backend cpu --input-len 5000 \
    --output-len 10 --num-prompts 1 --max-model-len 64
expect throughput-bad-dataset "cannot read" "$q" bench --throughput --model "$good" --backend cpu --dataset "$tmp/none.jsonl"
expect kernels-bad-m "entries must be in 1..16384\|without the CUDA backend\|no GPU was found" "$q" bench --kernels --m 0
expect kernels-bad-proj "unknown entry 'o'\|without the CUDA backend\|no GPU was found" "$q" bench --kernels --projs qkv,o
expect bandwidth-bad-size "entries must be in 1..16384\|without the CUDA backend\|no GPU was found" "$q" bench --bandwidth --sizes-mb 0
expect loadgen-bad-url "takes http://HOST:PORT\|without cpp-httplib" "$q" bench --serve localhost:1
expect loadgen-no-server "no answer from\|without cpp-httplib" "$q" bench --serve http://127.0.0.1:1 --num-prompts 1
expect tp-uneven-kv "rank count must be a multiple of 4" "$q" plan --tp 6 --preset qwen2.5-7b
expect tp-zero "must be at least 1" "$q" plan --tp 0 --model "$good"
expect tp-plan-context "--context must be at least 1" "$q" plan --tp 2 --preset qwen2.5-7b --context 0
# --tp on the engines: the CPU backend runs it, the GPUs where there are enough of them; the rest is refused before loading.
expect tp-cuda "no CUDA device found\|CUDA device(s) present\|built without CUDA and NCCL" "$q" logits --model "$good" --tokens 1 --out "$tmp/x.npy" --backend cuda --tp 64
expect tp-nodes-uneven "does not split evenly over --nnodes 2" "$q" logits --model "$good" --tokens 1 --out "$tmp/x.npy" --tp 3 --nnodes 2 --master-addr 127.0.0.1:29500
expect tp-nodes-no-master "needs --master-addr HOST:PORT" "$q" logits --model "$good" --tokens 1 --out "$tmp/x.npy" --tp 2 --nnodes 2
expect tp-nodes-bad-master "expected HOST:PORT" "$q" bench --model "$good" --tp 2 --nnodes 2 --master-addr nohost
expect tp-nodes-bad-rank "--node-rank 2 is not in 0..1" "$q" logits --model "$good" --tokens 1 --out "$tmp/x.npy" --tp 2 --nnodes 2 --node-rank 2 --master-addr 127.0.0.1:29500
expect tp-nodes-cpu "across hosts runs on the GPUs only" "$q" logits --model "$good" --tokens 1 --out "$tmp/x.npy" --backend cpu --tp 2 --nnodes 2 --master-addr 127.0.0.1:29500
expect tp-too-many "more ranks than the model's" "$q" logits --model "$good" --tokens 1 --out "$tmp/x.npy" --backend cpu --tp 64
expect tp-bad-token "outside the vocabulary" "$q" logits --model "$good" --tokens 1,100000 --out "$tmp/x.npy" --backend cpu --tp 2
"$q" synth --preset tiny-qwen2 --quant nf4 --out "$tmp/nf4" >/dev/null 2>&1
expect tp-nf4 "is not split yet" "$q" logits --model "$tmp/nf4" --tokens 1 --out "$tmp/x.npy" --backend cpu --tp 2

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
