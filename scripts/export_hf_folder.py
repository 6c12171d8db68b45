#!/usr/bin/env python3
"""Export a GGUF model as a Hugging Face folder with transformers itself, and record
transformers' own logits on it for kvbench's parity test (tests/test_hf_folder.cpp).

transformers reads the GGUF (dequantizing every weight), and save_pretrained writes
config.json, model.safetensors and the tokenizer files, as a researcher's folder holds them.
The fixture holds, for each prompt, the token ids transformers' tokenizer gives, the top-8
logits at every position of transformers' fp32 forward over the folder, and its greedy
continuation of 12 tokens.

scripts/hf_folders.sh runs it for kvbench's three models in a venv of its own (transformers,
torch, gguf, accelerate, pinned); by hand:
    .venv-hf/bin/python scripts/export_hf_folder.py \
        --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf --out ~/.cache/kvbench/hf/smollm2-135m \
        [--dtype bfloat16] [--fixture ~/.cache/kvbench/hf/smollm2-135m/transformers_parity.json]
"""
import argparse
import json
import os

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Überraschung! Café, naïve, 東京, and emoji 🙂 in one line.",
    "Key 4731 holds the value 92. Key 18 holds 7. Which key holds 92?",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--fixture")
    args = ap.parse_args()
    folder, name = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                 dtype=getattr(torch, args.dtype))
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    print(f"wrote {args.out}: {sorted(os.listdir(args.out))}")
    if not args.fixture:
        return
    # transformers' forward over the folder just written, in fp32 (the weights as stored,
    # widened), as kvbench's CPU forward runs it.
    tok = AutoTokenizer.from_pretrained(args.out)
    model = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32)
    model.eval()
    cases = []
    for text in PROMPTS:
        ids = tok(text)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        top = torch.topk(logits, 8, dim=-1)
        with torch.no_grad():
            greedy = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                    attention_mask=torch.ones(1, len(ids), dtype=torch.long))
        cases.append({"text": text, "ids": ids, "greedy": greedy[0][len(ids):].tolist(),
                      "top_ids": top.indices.tolist(),
                      "top_logits": [[round(v, 5) for v in row] for row in top.values.tolist()]})
    with open(args.fixture, "w") as f:
        json.dump({"source": f"transformers {__import__('transformers').__version__}, "
                             f"torch {torch.__version__}, fp32 forward over the exported folder "
                             f"({args.dtype} weights)",
                   "gguf": name, "cases": cases}, f, indent=1)
    print(f"wrote {args.fixture}")


if __name__ == "__main__":
    main()
