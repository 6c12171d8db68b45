#!/usr/bin/env python3
"""A tiny Qwen3 with random weights, made by transformers from a config (no download), saved
as a Hugging Face folder, with transformers' own logits over it: tests/test_hf_folder.cpp
holds kvbench's forward over the same folder to them.

    .venv-kvpress/bin/python scripts/make_qwen3_fixture.py tests/fixtures/hf_qwen3_tiny

head_dim (64: what the CUDA kernels take) is not hidden_size / heads (16), as in the Qwen3 models, and the per-head
query and key norms get random weights, so that a misplaced norm or a wrong order of its
weights moves the logits. The weights are saved in bfloat16; transformers runs them in fp32.
"""
import json
import os
import sys

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

out = sys.argv[1]
torch.manual_seed(0)
config = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                     max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
                     tie_word_embeddings=False, attention_bias=False)
model = Qwen3ForCausalLM(config)
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.uniform_(0.5, 1.5)
        else:
            p.normal_(0.0, 0.2)
model = model.to(torch.bfloat16)
os.makedirs(out, exist_ok=True)
model.save_pretrained(out)
model = Qwen3ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
ids = [1, 17, 200, 45, 99, 3, 250, 128, 7, 64, 33, 290]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0]
with open(os.path.join(out, "logits.json"), "w") as f:
    json.dump({"source": f"transformers {__import__('transformers').__version__}, torch "
                         f"{torch.__version__}: Qwen3ForCausalLM fp32 forward over this folder",
               "ids": ids, "logits": [[round(v, 6) for v in row] for row in logits.tolist()]}, f)
print("wrote", out, sorted(os.listdir(out)))
