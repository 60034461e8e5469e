# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT, $gen, has and note set.
"$Q" synth --preset qwen2.5-0.5b --out /tmp/synth-qwen2.5-0.5b >/dev/null
python3 scripts/hf_bench.py /tmp/synth-qwen2.5-0.5b --model qwen2.5-0.5b --input-lens 1 --gen 64 --modes compiled --out "$OUT/hf-quick.json" 2>&1 | tail -3
