#!/usr/bin/env bash
# Every quantized format qinfer reads, in its exact hub layout (written by `qinfer synth --quant`):
#  1. `qinfer dequant` (the CPU reference's weights) equals scripts/quant_ref.py, an independent numpy
#     implementation of FORMATS.md, tensor for tensor, bit for bit;
#  2. the quantized checkpoint's CPU logits equal those of its dequantized fp32 copy.
set -u
q="$1"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
py=python3
for cand in /usr/bin/python3 python3; do
    if "$cand" -c 'import numpy' 2>/dev/null; then py="$cand"; break; fi
done
"$py" -c 'import numpy' 2>/dev/null || { echo "numpy is missing (apt-get install python3-numpy)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
n=0
check() {  # NAME PRESET SYNTH-OPTIONS...
    local name="$1" preset="$2"
    shift 2
    local d="$tmp/$name"
    n=$((n + 1))
    if ! "$q" synth --preset "$preset" --out "$d" "$@" >/dev/null 2>"$tmp/err"; then
        echo "FAIL $name: synth: $(cat "$tmp/err")"; fails=$((fails + 1)); return
    fi
    "$q" dequant --model "$d" --out "$d-dense" >/dev/null || { echo "FAIL $name: dequant"; fails=$((fails + 1)); return; }
    if ! out=$("$py" "$repo/scripts/quant_ref.py" check "$d" "$d-dense"); then
        echo "FAIL $name: $out"; fails=$((fails + 1)); return
    fi
    "$q" logits --backend cpu --model "$d" --tokens 1,7,42,3,99 --out "$d/q.npy" 2>/dev/null &&
        "$q" logits --backend cpu --model "$d-dense" --tokens 1,7,42,3,99 --out "$d/dense.npy" 2>/dev/null ||
        { echo "FAIL $name: logits"; fails=$((fails + 1)); return; }
    if ! cmp -s "$d/q.npy" "$d/dense.npy"; then
        diff=$("$py" -c "import numpy as n, sys; a, b = n.load(sys.argv[1]), n.load(sys.argv[2]); print(abs(a - b).max())" "$d/q.npy" "$d/dense.npy")
        echo "FAIL $name: quantized and dequantized logits differ by $diff"; fails=$((fails + 1)); return
    fi
    echo "ok   $name: $out; logits identical"
}

check gptq4-g128-partial tiny-qwen2 --quant gptq-int4 --group-size 128
check gptq4-g-1 tiny-qwen2 --quant gptq-int4 --group-size -1
check gptq4-g64-asym-v1 tiny-qwen2 --quant gptq-int4 --group-size 64 --asym
check gptq4-act-v1 tiny-qwen2 --quant gptq-int4 --group-size 32 --desc-act
check gptq4-act-asym-v2 tiny-qwen3 --quant gptq-int4 --group-size 32 --desc-act --asym --gptq-format v2
check gptq8-g32 tiny-qwen2 --quant gptq-int8 --group-size 32
check gptq8-act-asym tiny-llama3 --quant gptq-int8 --group-size 32 --desc-act --asym
check gptq3-g32 tiny-qwen2 --quant gptq-int3 --group-size 32
check gptq3-act-asym-v2 tiny-qwen2 --quant gptq-int3 --group-size 32 --desc-act --asym --gptq-format v2
check gptq2-g32 tiny-qwen2 --quant gptq-int2 --group-size 32 --asym
check gptq4-moe tiny-qwen2-moe --quant gptq-int4 --group-size 32
check awq-g32 tiny-qwen2 --quant awq --group-size 32
check awq-g-1 tiny-qwen3 --quant awq --group-size -1
check awq-gemv-g32 tiny-qwen2 --quant awq-gemv --group-size 32
check awq-gemv-g64 tiny-qwen2-k128 --quant awq-gemv --group-size 64
check autoround-sym tiny-qwen2 --quant autoround-sym --group-size 32
check autoround-asym tiny-qwen2 --quant autoround-asym --group-size 32
check nf4 tiny-qwen2 --quant nf4
check nf4-double-quant tiny-qwen3 --quant nf4 --double-quant
check fp4 tiny-qwen2 --quant fp4
check fp4-double-quant tiny-llama3 --quant fp4 --double-quant
echo "$((n - fails))/$n quantized formats pass"
[ "$fails" -eq 0 ]
