#!/usr/bin/env python3
"""Golden logits from Hugging Face transformers for qinfer's tests (run where torch + transformers exist).

For every case: `qinfer synth` writes a tiny checkpoint (odd sizes; deterministic from preset + seed + dtype),
transformers loads it strictly (no missing/unexpected keys), runs a 32-token greedy continuation of a fixed prompt
and the fp32 logits of the whole sequence. The test rebuilds the same checkpoint with `qinfer synth` and compares.
A checkpoint written by transformers itself (save_pretrained) is committed too, to test reading hub-written files.
Also loads `qinfer synth` output of published shapes (2 layers) in transformers, checking keys only.

Quantized cases: `qinfer synth --quant ...` writes the checkpoint in its hub layout; scripts/quant_ref.py (numpy, an
independent implementation of FORMATS.md) dequantizes it to fp32, and transformers runs that dense copy.

usage: make_goldens.py QINFER_BINARY OUT_DIR [--skip-large] [--quant-only]
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

torch.backends.cuda.matmul.allow_tf32 = False
torch.set_num_threads(min(16, os.cpu_count() or 1))

PROMPT = [(i * 37 + 11) % 251 for i in range(12)]
N_GREEDY = 32

# name, preset, dtype, seed
CASES = [
    ("qwen2-fp32", "tiny-qwen2", "fp32", 1),
    ("qwen2-bf16", "tiny-qwen2", "bf16", 2),
    ("qwen2-fp16", "tiny-qwen2", "fp16", 3),
    ("qwen1.5-fp32", "tiny-qwen1.5", "fp32", 4),
    ("qwen2-yarn-fp32", "tiny-qwen2-yarn", "fp32", 5),
    ("qwen2-yarn-same-max-fp32", "tiny-qwen2-yarn-same-max", "fp32", 6),
    ("qwen2-linear-fp32", "tiny-qwen2-linear", "fp32", 7),
    ("qwen3-fp32", "tiny-qwen3", "fp32", 8),
    ("llama3-fp32", "tiny-llama3", "fp32", 9),
    ("qwen2-moe-fp32", "tiny-qwen2-moe", "fp32", 10),
    ("qwen3-moe-fp32", "tiny-qwen3-moe", "fp32", 11),
]
# name, preset, seed, synth options: quantized checkpoints (fp16 unquantized tensors, as the hub's exports)
QUANT_CASES = [
    ("qwen2-gptq4-act-order", "tiny-qwen2", 21, ["--quant", "gptq-int4", "--group-size", "32", "--desc-act"]),
    ("qwen2-gptq8-asym-v2", "tiny-qwen2", 22, ["--quant", "gptq-int8", "--group-size", "32", "--asym", "--gptq-format", "v2"]),
    ("llama3-awq", "tiny-llama3", 23, ["--quant", "awq", "--group-size", "32"]),
    ("qwen2-autoround-sym", "tiny-qwen2", 24, ["--quant", "autoround-sym", "--group-size", "32"]),
    ("qwen2-nf4-double-quant", "tiny-qwen2-k128", 25, ["--quant", "nf4", "--double-quant"]),
    ("qwen2-moe-gptq8", "tiny-qwen2-moe", 26, ["--quant", "gptq-int8", "--group-size", "16"]),
]
TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def load_strict(path, dtype):
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")}
    if bad:
        raise SystemExit(f"{path}: transformers reports {bad}")
    return model.eval()


@torch.no_grad()
def greedy_and_logits(model, prompt):
    ids = list(prompt)
    for _ in range(N_GREEDY):
        logits = model(torch.tensor([ids])).logits[0, -1]
        ids.append(int(torch.argmax(logits.float())))
    full = model(torch.tensor([ids])).logits[0].float().numpy()
    return ids[len(prompt):], full


def rope_info(model):
    emb = model.model.rotary_emb
    return {"inv_freq": [float(x) for x in emb.inv_freq.float()], "attention_scaling": float(emb.attention_scaling)}


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def main():
    qinfer, out = sys.argv[1], sys.argv[2]
    skip_large = "--skip-large" in sys.argv
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp()
    index = []
    failed = []
    quant_only = "--quant-only" in sys.argv
    here = os.path.dirname(os.path.abspath(__file__))
    for name, preset, seed, options in QUANT_CASES:
        d, dense = os.path.join(tmp, name), os.path.join(tmp, name + "-dense")
        subprocess.run([qinfer, "synth", "--preset", preset, "--out", d, "--seed", str(seed)] + options, check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([sys.executable, os.path.join(here, "quant_ref.py"), "dense", d, dense], check=True, stdout=subprocess.DEVNULL)
        model = load_strict(dense, torch.float32)
        greedy, logits = greedy_and_logits(model, PROMPT)
        np.save(os.path.join(out, name + ".npy"), logits.astype(np.float32))
        json.dump({"name": name, "preset": preset, "dtype": "quant", "seed": seed, "synth": options, "prompt": PROMPT,
                   "greedy": greedy, "logits": name + ".npy", "rope": rope_info(model),
                   "safetensors_sha256": sha256(os.path.join(d, "model.safetensors")),
                   "transformers": transformers.__version__, "torch": torch.__version__},
                  open(os.path.join(out, name + ".json"), "w"), indent=1)
        index.append(name)
        print(f"golden {name}: greedy {greedy[:8]}...", flush=True)
    if quant_only:
        json.dump(index, open(os.path.join(out, "index.json"), "w"), indent=1)
        return
    for name, preset, dtype, seed in CASES:
        d = os.path.join(tmp, name)
        subprocess.run([qinfer, "synth", "--preset", preset, "--out", d, "--seed", str(seed), "--dtype", dtype], check=True,
                       stdout=subprocess.DEVNULL)
        try:
            model = load_strict(d, TORCH_DTYPE[dtype])
        except BaseException as e:  # report and go on with the other cases
            print(f"golden {name}: transformers could not load it: {e}", flush=True)
            failed.append(name)
            continue
        greedy, logits = greedy_and_logits(model, PROMPT)
        np.save(os.path.join(out, name + ".npy"), logits.astype(np.float32))
        meta = {"name": name, "preset": preset, "dtype": dtype, "seed": seed, "prompt": PROMPT, "greedy": greedy,
                "logits": name + ".npy", "rope": rope_info(model),
                "safetensors_sha256": sha256(os.path.join(d, "model.safetensors")),
                "transformers": transformers.__version__, "torch": torch.__version__}
        json.dump(meta, open(os.path.join(out, name + ".json"), "w"), indent=1)
        index.append(name)
        print(f"golden {name}: greedy {greedy[:8]}...", flush=True)

    # A checkpoint written by transformers itself (bf16 on disk, logits computed in fp32 on the upcast weights).
    torch.manual_seed(0)
    cfg = AutoConfig.for_model("qwen2", vocab_size=256, hidden_size=96, intermediate_size=160, num_hidden_layers=3,
                               num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
                               tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=10000.0)
    hf = AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():
        for p in hf.parameters():  # wider than the default init, so logits are not all near zero
            p.normal_(0.0, 0.2 if p.dim() > 1 else 0.5)
            if p.dim() == 1:
                p.add_(1.0)
    hf_dir = os.path.join(out, "hf-tiny-qwen2")
    hf.to(torch.bfloat16).save_pretrained(hf_dir)
    for f in os.listdir(hf_dir):
        if f not in ("config.json", "model.safetensors", "generation_config.json"):
            os.remove(os.path.join(hf_dir, f))
    model = load_strict(hf_dir, torch.float32)
    greedy, logits = greedy_and_logits(model, PROMPT)
    np.save(os.path.join(out, "hf-tiny-qwen2.npy"), logits.astype(np.float32))
    json.dump({"name": "hf-tiny-qwen2", "checkpoint": "hf-tiny-qwen2", "dtype": "bf16-as-fp32", "prompt": PROMPT,
               "greedy": greedy, "logits": "hf-tiny-qwen2.npy", "rope": rope_info(model),
               "transformers": transformers.__version__}, open(os.path.join(out, "hf-tiny-qwen2.json"), "w"), indent=1)
    index.append("hf-tiny-qwen2")
    json.dump(index, open(os.path.join(out, "index.json"), "w"), indent=1)

    # Published shapes, 2 layers: transformers must load qinfer synth output with no missing or unexpected keys.
    if not skip_large:
        for preset in ["qwen2.5-0.5b", "qwen2.5-7b", "qwen2-57b-a14b", "qwen3-8b"]:
            d = os.path.join(tmp, preset)
            subprocess.run([qinfer, "synth", "--preset", preset, "--out", d, "--layers", "2"], check=True,
                           stdout=subprocess.DEVNULL)
            try:
                load_strict(d, torch.bfloat16)
            except BaseException as e:
                print(f"transformers could not load qinfer synth --preset {preset} --layers 2: {e}", flush=True)
                failed.append(preset)
                continue
            print(f"transformers loads qinfer synth --preset {preset} --layers 2: no missing or unexpected keys", flush=True)
            subprocess.run(["rm", "-rf", d])
    if failed:
        raise SystemExit(f"failed: {failed}")


if __name__ == "__main__":
    main()
