# shellcheck shell=bash
# A stage of scripts/device.sh, which sources it with $Q (the qinfer binary), $OUT and note set.
# One forward pass's logits under two settings of the environment, compared: the end-to-end check of a kernel path that
# an A/B knob switches (the knob's off arm is the reference). LOGITS_AB_SPECS entries preset:layers:tokens:VAR=a:VAR=b
# (default qwen1.5-moe-a2.7b:4:3000:QINFER_PREFILL_CHUNK=1024:QINFER_PREFILL_CHUNK=4096: passes of 1024 and 4096 tokens): a synthesized checkpoint of that many
# layers, a prompt of that many token ids, `qinfer logits` under each setting; prints the largest absolute difference
# and the relative L2 difference of the two [tokens, vocab] arrays, and whether each row's argmax agrees. A preset
# written preset@quant (e.g. qwen1.5-moe-a2.7b@gptq-int4) is synthesized in that format. A setting written --opt=value
# is an option of `qinfer logits` instead (e.g. --tp=1 against --tp=3: the ranks' split against the whole model).
# logits_with SETTING OUT: `qinfer logits` of the spec's prompt to OUT under SETTING (an environment variable or an option).
logits_with() {
    local vars=() opts=()
    if [[ "$1" == --* ]]; then opts=("${1%%=*}" "${1#*=}"); else vars=("$1"); fi
    env "${vars[@]}" "$Q" logits --model "$dir" --tokens "$toks" --out "$2" "${opts[@]}" 2>&1 | grep -iE "error" | tee -a "$OUT/logits-ab.log"
}
for spec in ${LOGITS_AB_SPECS:-qwen1.5-moe-a2.7b:4:3000:QINFER_PREFILL_CHUNK=1024:QINFER_PREFILL_CHUNK=4096}; do
    IFS=: read -r preset layers n set_a set_b <<<"$spec"
    quant_args=()
    [[ "$preset" == *@* ]] && quant_args=(--quant "${preset#*@}")
    dir=/tmp/logits-ab-${preset//@/-}-$layers
    [ -f "$dir/config.json" ] || "$Q" synth --preset "${preset%@*}" "${quant_args[@]}" --layers "$layers" --out "$dir" >/dev/null 2>&1
    toks=$(python3 -c "import json; v = json.load(open('$dir/config.json'))['vocab_size']; print(','.join(str((i * 7919) % (v - 10) + 10) for i in range($n)))")
    logits_with "$set_a" /tmp/logits-ab-a.npy
    logits_with "$set_b" /tmp/logits-ab-b.npy
    python3 - "$spec" <<'PY' 2>&1 | tee -a "$OUT/logits-ab.log"
import sys
import numpy as np
a, b = np.load("/tmp/logits-ab-a.npy"), np.load("/tmp/logits-ab-b.npy")
rel = float(np.linalg.norm(a - b) / np.linalg.norm(a))
agree = float((a.argmax(-1) == b.argmax(-1)).mean())
print(f"logits-ab {sys.argv[1]}: shape {a.shape}, max |a - b| {abs(a - b).max():.4g}, relative L2 {rel:.3g}, argmax agrees on {100 * agree:.1f}% of rows")
PY
done
