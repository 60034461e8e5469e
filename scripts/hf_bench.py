#!/usr/bin/env python3
"""Hugging Face transformers on the same synthetic checkpoint and card as `qinfer bench`, for side-by-side ratios.

Modes: eager (dynamic cache, sdpa) and compiled (static cache, which transformers runs through torch.compile). Speed is the
seeds' definition: generated tokens / wall time of the whole generate() call, prefill included; generation does not
stop at end-of-sequence. Writes JSON rows that `qinfer bench --baseline FILE` reads.

usage: hf_bench.py MODEL_DIR --model NAME --input-lens 1,6144 --gen 256 --modes eager,compiled --out hf.json
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def run(model, input_len, gen, vocab, static):
    ids = torch.randint(0, min(vocab, 151643), (1, input_len), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    kw = dict(max_new_tokens=gen, min_new_tokens=gen, do_sample=False, eos_token_id=None, pad_token_id=0)
    if static:
        kw["cache_implementation"] = "static"
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, **kw)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    assert out.shape[1] == input_len + gen, out.shape
    return secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--model", required=True)
    ap.add_argument("--input-lens", default="1")
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for mode in a.modes.split(","):
        model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.bfloat16, attn_implementation="sdpa").cuda().eval()
        vocab = model.config.vocab_size
        static = mode == "compiled"
        # static cache: transformers compiles the decoding forward itself (generation_config.compile_config).
        for n in [int(x) for x in a.input_lens.split(",")]:
            run(model, n, 8 if not static else a.gen, vocab, static)  # warm-up (compiles for this shape)
            torch.cuda.reset_peak_memory_stats()
            secs = run(model, n, a.gen, vocab, static)
            row = {"engine": "hf-" + mode, "model": a.model, "input_len": n, "gen_len": a.gen, "tok_s": a.gen / secs,
                   "peak_gb": torch.cuda.max_memory_allocated() / 1e9, "card": torch.cuda.get_device_name(),
                   "torch": torch.__version__}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del model
        torch.cuda.empty_cache()
    json.dump(rows, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
