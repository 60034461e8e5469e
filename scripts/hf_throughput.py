#!/usr/bin/env python3
"""transformers' own continuous batching (generate_batch, paged sdpa) on the same synthetic checkpoint, card and
workload as `qinfer bench --throughput`, for the ratio: random token prompts of --input-len, greedy, --output-len
new tokens each (end of sequence ignored), every prompt given at once. Prints one JSON row.

usage: hf_throughput.py MODEL_DIR --model NAME --num-prompts 200 --input-len 100 --output-len 250 --out hf-tp.json
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM
from transformers.generation import GenerationConfig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--model", required=True)
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--input-len", type=int, default=100)
    ap.add_argument("--output-len", type=int, default=250)
    ap.add_argument("--attn", default="paged|sdpa")  # transformers 5.17's name for paged SDPA
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.bfloat16, attn_implementation=a.attn, device_map="cuda").eval()
    vocab = min(model.config.vocab_size, 151643)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (a.input_len,), generator=g).tolist() for _ in range(a.num_prompts)]
    cfg = GenerationConfig(max_new_tokens=a.output_len, min_new_tokens=a.output_len, do_sample=False, eos_token_id=None, pad_token_id=0)
    model.generate_batch(inputs=prompts[: min(8, len(prompts))], generation_config=GenerationConfig(
        max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0), progress_bar=False)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = model.generate_batch(inputs=prompts, generation_config=cfg, progress_bar=False)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    generated = sum(len(o.generated_tokens) for o in out.values())
    row = {"engine": "transformers generate_batch (" + a.attn + ")", "model": a.model, "num_prompts": a.num_prompts,
           "input_len": a.input_len, "output_len": a.output_len, "seconds": secs, "output_tokens": generated,
           "output_tok_s": generated / secs, "requests_s": len(out) / secs, "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
           "card": torch.cuda.get_device_name(0), "torch": torch.__version__}
    import transformers
    row["transformers"] = transformers.__version__
    print(json.dumps(row))
    with open(a.out, "w") as f:
        json.dump([row], f, indent=2)


if __name__ == "__main__":
    main()
