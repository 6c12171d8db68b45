#!/usr/bin/env python3
"""kvbench's cache methods beside kvpress's presses on the same model, prompts and budgets.

For each prompt (three excerpts of the pinned GNU prose corpus, about 400, 650 and 900
tokens, each ending in a question), each budget (64 and 256 tokens) and each method, both
sides compress the whole prompt, then decode 24 greedy tokens:

- kvbench: `kvbench --model GGUF generate --raw --prompt TEXT --method SPEC --max-new 24`;
- kvpress 0.5.4: the same GGUF dequantized to fp32 by transformers, the press applied to the
  prompt's prefill (`with press(model)`), then greedy decoding with positions continuing
  after the uncompressed prompt, as kvpress's own pipeline does.

A pair agrees when the two continuations are the same text up to where kvbench's reply
ends (its end of turn, or 24 tokens). Prints the agreement table (docs/methods.md has it).
Needs a scratch venv with kvpress (about 3 GB: transformers and CUDA torch, run on the CPU):

    python3 -m venv .venv-kvpress
    .venv-kvpress/bin/pip install "kvpress==0.5.4" "transformers>=4.56,<5.3" gguf
    .venv-kvpress/bin/python scripts/kvpress_side_by_side.py --model models/X.gguf

Not a CI test (the venv is too large); kvbench itself never depends on Python.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUESTION = "\n\nQuestion: what is the main point of the text above?\nAnswer:"


def prompts(tokenizer):
    """Three excerpts of the pinned GNU standards text, cut at about 400, 650 and 900 tokens."""
    path = os.path.join(ROOT, "corpora", "gnu-standards", "standards.txt")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out = []
    for start, tokens in ((20000, 400), (60000, 650), (120000, 900)):
        # Whitespace runs collapsed: llama.cpp's and transformers' GGUF tokenizers split runs
        # of spaces and newlines differently, and both sides must see the same token ids.
        flat = " ".join(text[start:start + tokens * 8].split())
        ids = tokenizer(flat, add_special_tokens=False).input_ids
        out.append(tokenizer.decode(ids[:tokens]) + QUESTION)
    return out


def presses(kvpress, ratio):
    """kvbench spec (without its budget) -> the kvpress press at `ratio`."""
    snap = lambda: kvpress.SnapKVPress(compression_ratio=ratio, window_size=32, kernel_size=5)
    return [
        ("full", None),
        ("snapkv", snap()),
        ("streamingllm", kvpress.StreamingLLMPress(compression_ratio=ratio, n_sink=4)),
        ("tova", kvpress.TOVAPress(compression_ratio=ratio)),
        ("keydiff", kvpress.KeyDiffPress(compression_ratio=ratio)),
        ("expected_attention", kvpress.ExpectedAttentionPress(
            compression_ratio=ratio, n_future_positions=512, n_sink=4, use_covariance=True,
            use_vnorm=True)),
        ("adakv+snapkv", kvpress.AdaKVPress(snap(), alpha_safeguard=0.2)),
        ("criticalkv", kvpress.CriticalKVPress(snap(), epsilon=1e-4, first_stage_ratio=0.5)),
        ("knorm:skip=0", kvpress.KnormPress(compression_ratio=ratio)),
        ("lagkv", kvpress.LagKVPress(compression_ratio=ratio, n_sink=4, lag_size=128)),
        ("chunkkv", kvpress.ChunkKVPress(snap(), chunk_length=10)),
        ("pyramidkv", kvpress.PyramidKVPress(compression_ratio=ratio, window_size=32,
                                             kernel_size=5)),
    ]


def with_budget(spec, budget):
    name, _, params = spec.partition(":")
    first = name.split("+")[-1]
    if spec == "full":
        return spec
    if "+" in name:  # adakv+snapkv: the budget is the eviction method's
        head = name.rsplit("+", 1)[0]
        return f"{head}+{first}:budget={budget}" + (f",{params}" if params else "")
    return f"{name}:budget={budget}" + (f",{params}" if params else "")


def kvbench_reply(binary, model, prompt, spec, threads):
    run = subprocess.run([binary, "--model", model, "--threads", str(threads), "generate",
                          "--raw", "--prompt", prompt, "--method", spec, "--max-new", "24"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        return None, run.stderr.strip().splitlines()[-1] if run.stderr else "failed"
    reply, _, summary = run.stdout.partition("\n\nprefill: ")
    return reply, summary.split(" tokens")[0]


def kvpress_reply(torch, model, tokenizer, prompt, press):
    from transformers import DynamicCache
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    cache = DynamicCache()
    with torch.no_grad():
        if press is None:
            out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        else:
            with press(model):
                out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        generated = [int(out.logits[0, -1].argmax())]
        position = ids.shape[1]
        for _ in range(23):
            if generated[-1] == tokenizer.eos_token_id:
                break
            out = model(input_ids=torch.tensor([[generated[-1]]]), past_key_values=cache,
                        position_ids=torch.tensor([[position]]), use_cache=True)
            position += 1
            generated.append(int(out.logits[0, -1].argmax()))
    return tokenizer.decode(generated, skip_special_tokens=True), ids.shape[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="GGUF file")
    parser.add_argument("--kvbench", default=os.path.join(ROOT, "build", "kvbench"))
    parser.add_argument("--budgets", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="kvbench method names to run (default: all)")
    args = parser.parse_args()

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    import kvpress
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    transformers.utils.logging.disable_progress_bar()

    torch.set_num_threads(args.threads)
    folder, name = os.path.split(os.path.abspath(args.model))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # Eager attention scores presses that need the weights; AdaKV and ChunkKV refuse eager
    # in kvpress 0.5.4, so they run on sdpa (the same numbers, another kernel).
    models = {}
    for impl in ("eager", "sdpa"):
        m = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32,
                                                 attn_implementation=impl)
        m.eval()
        if getattr(m.config, "head_dim", None) is None:  # CriticalKVPress reads it (Qwen2)
            m.config.head_dim = m.config.hidden_size // m.config.num_attention_heads
        models[impl] = m

    texts = prompts(tokenizer)
    table = {}
    for p, prompt in enumerate(texts):
        for budget in args.budgets:
            n = len(tokenizer(prompt, add_special_tokens=False).input_ids)
            # kvpress keeps int(n (1 - ratio)) tokens: half a token of margin so that the
            # float product is not 63.9999 for a budget of 64.
            ratio = 1 - (budget + 0.5) / n
            for spec, press in presses(kvpress, ratio):
                if args.only and spec.split(":")[0] not in args.only:
                    continue
                if spec == "full" and budget != args.budgets[0]:
                    continue
                full_spec = with_budget(spec, budget)
                ours, prefilled = kvbench_reply(args.kvbench, args.model, prompt, full_spec,
                                                args.threads)
                impl = "sdpa" if spec.split(":")[0] in ("adakv+snapkv", "chunkkv") else "eager"
                try:
                    theirs, n_ids = kvpress_reply(torch, models[impl], tokenizer, prompt, press)
                except Exception as e:  # kvpress itself failing is a result too
                    theirs, n_ids = None, f"kvpress failed: {type(e).__name__}: {e}"[:120]
                if ours is None or theirs is None:
                    same = None
                elif str(prefilled) != str(n_ids):  # not the same prompt: no comparison
                    same = None
                    theirs = f"{theirs} [prompt tokens differ: kvbench {prefilled}, hf {n_ids}]"
                else:
                    a, b = ours.strip(), theirs.strip()
                    same = b.startswith(a) if a else b == ""
                row = table.setdefault(spec, [0, 0, []])
                row[1] += 1
                row[0] += bool(same)
                if not same:
                    row[2].append(f"prompt {p} ({n} tokens) budget {budget}: kvbench "
                                  f"{ours!r} / kvpress {theirs!r} ({prefilled} vs {n_ids} "
                                  "prompt tokens)")
                print(f"{full_spec:40s} prompt {p} budget {budget}: "
                      f"{'agree' if same else 'DIFFER'}", flush=True)

    print(f"\n| method (kvbench spec) | agree |\n|---|---:|")
    for spec, (agree, total, _) in table.items():
        print(f"| {spec} | {agree}/{total} |")
    for spec, (_, _, why) in table.items():
        for line in why:
            print(f"{spec}: {line}")


if __name__ == "__main__":
    sys.exit(main())
