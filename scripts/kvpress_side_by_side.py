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

With `--samples FILE` it compares accuracy instead, on a generated task's samples as
kvbench feeds them (`kvbench list tasks --export TASK --samples N --context-tokens T -o FILE`),
laid out as kvbench lays out a multi-request session, query-agnostic: the chat head, the
context and a blank line compressed once (kvbench's `ratio`, the kept share, as kvpress's
compression_ratio = 1 - kept/n with kvbench's ceil(ratio n) kept tokens), then each question
alone on a copy of that cache, with positions after the uncompressed context, greedy to the
task's length (kvpress's pipeline does the same). One forward of the context per sample
serves every press: each press's own forward_hook runs on a cache of its own in every
attention layer (a layer's compression never reaches the next layer's input in kvpress's
prefill). kvbench runs `kvbench session --mode multi-request` on the same file; both sides'
answers are scored by `kvbench score` (kvbench's scorer), and the script prints accuracy
with Wilson intervals for both and how many answers are the same text:

    build/kvbench --model M list tasks --export niah --samples 10 --context-tokens 4096 -o niah.jsonl
    .venv-kvpress/bin/python scripts/kvpress_side_by_side.py --model M --samples niah.jsonl \
        --ratios 0.5 0.25 --out kvbench-out/kvpress-niah

Not a CI test (the venv is too large); kvbench itself never depends on Python.
"""
import argparse
import copy
import json
import math
import os
import subprocess
import sys
import time

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


# ---- Accuracy on exported samples (--samples) ---------------------------------------------

# kvbench spec (without its ratio) -> a function of kvpress and its compression_ratio.
ACCURACY_PRESSES = {
    "snapkv": lambda kp, cr: kp.SnapKVPress(compression_ratio=cr, window_size=32, kernel_size=5),
    "pyramidkv": lambda kp, cr: kp.PyramidKVPress(compression_ratio=cr, window_size=32,
                                                  kernel_size=5),
    "tova": lambda kp, cr: kp.TOVAPress(compression_ratio=cr),
    "expected_attention": lambda kp, cr: kp.ExpectedAttentionPress(
        compression_ratio=cr, n_future_positions=512, n_sink=4, use_covariance=True,
        use_vnorm=True),
    "streamingllm": lambda kp, cr: kp.StreamingLLMPress(compression_ratio=cr, n_sink=4),
    "knorm:skip=0": lambda kp, cr: kp.KnormPress(compression_ratio=cr),
    "keydiff": lambda kp, cr: kp.KeyDiffPress(compression_ratio=cr),
    "criticalkv": lambda kp, cr: kp.CriticalKVPress(
        kp.SnapKVPress(compression_ratio=cr, window_size=32, kernel_size=5), epsilon=1e-4,
        first_stage_ratio=0.5),
    "adakv+snapkv": lambda kp, cr: kp.AdaKVPress(
        kp.SnapKVPress(compression_ratio=cr, window_size=32, kernel_size=5),
        alpha_safeguard=0.2),
}


def kvbench_spec(method, ratio):
    if method == "full":
        return "full"
    name, _, params = method.partition(":")
    return f"{name}:ratio={ratio}" + (f",{params}" if params else "")


def chat_layout(tokenizer):
    """kvbench's cut of the chat template (harness/session.cpp, chat_layout): the text before
    and after one user message, with the template's default system prompt."""
    mark = "\u2063KVBENCH\u2063"
    one = tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False,
                                        add_generation_prompt=True)
    head, _, tail = one.partition(mark)
    return head, tail


def encode(tokenizer, text, bos):
    ids = tokenizer(text, add_special_tokens=False).input_ids
    if bos and getattr(tokenizer, "add_bos_token", False) and tokenizer.bos_token_id is not None:
        ids = [tokenizer.bos_token_id] + ids
    return ids


def task_lengths(binary):
    """Tokens decoded per turn for every generated task, from `kvbench list tasks`."""
    out = subprocess.run([binary, "list", "tasks"], capture_output=True, text=True,
                         check=True).stdout
    lengths, task = {}, None
    for line in out.splitlines():
        if line and not line.startswith(" "):
            task = line.strip()
        elif task and "new tokens per turn" in line:
            lengths[task] = int(line.split("at most ")[1].split(" new")[0])
    return lengths


class MultiPress:
    """One prefill, every press: in each attention layer, each press's own forward_hook runs
    on a cache of its own that holds the layer's full keys and values (kvpress compresses a
    layer's cache after the layer; the next layer's input does not depend on it). A press that
    compresses head-wise by masking (AdaKV: kvpress keeps every key and leaves the layer's
    `masked_key_indices` for its attention patch to hide at decoding) has its masks kept
    here per layer, and put back on the layers only while its own answers are decoded."""

    def __init__(self, model, presses):
        self.model, self.presses = model, presses
        self.caches = None
        self.masks = {}  # press name -> {layer: masked_key_indices}

    def hook(self, module, args, kwargs, output):
        full = kwargs["past_key_values"]
        i = module.layer_idx
        keys, values = full.layers[i].keys, full.layers[i].values
        for name, press in self.presses.items():
            cache = self.caches[name]
            cache.update(keys, values, i)
            press.forward_hook(module, args, dict(kwargs, past_key_values=cache), output)
            masked = getattr(module, "masked_key_indices", None)
            if masked is not None:
                self.masks.setdefault(name, {})[i] = masked
                module.masked_key_indices = None  # not the next press's, nor the full cache's
        return output

    def prefill(self, torch, ids):
        from transformers import DynamicCache
        self.caches = {name: DynamicCache() for name in self.presses}
        language = self.model.model
        hooks = []
        for press in self.presses.values():
            press.post_init_from_model(self.model)
        try:
            for layer in language.layers:
                layer.self_attn.rotary_emb = language.rotary_emb
                hooks.append(layer.self_attn.register_forward_hook(self.hook, with_kwargs=True))
            full = DynamicCache()
            with torch.no_grad():
                language(input_ids=torch.tensor([ids]), past_key_values=full)
        finally:
            for h in hooks:
                h.remove()
        self.caches["full"] = full
        return self.caches


def answer(torch, model, tokenizer, cache, context_length, query_ids, max_new, stop_ids):
    """kvpress's pipeline's generate_answer, on a copy of the compressed cache."""
    cache = copy.deepcopy(cache)
    with torch.no_grad():
        position = torch.arange(context_length, context_length + len(query_ids)).unsqueeze(0)
        if len({cache.get_seq_length(i) for i in range(len(cache))}) == 1:
            out = model(input_ids=torch.tensor([query_ids]), past_key_values=cache,
                        position_ids=position)
        else:
            # Layers of different lengths (PyramidKV): transformers builds one causal mask from
            # layer 0's length, so the query goes in a token at a time (no mask), as decoding.
            for i, token in enumerate(query_ids):
                out = model(input_ids=torch.tensor([[token]]), past_key_values=cache,
                            position_ids=position[:, i:i + 1])
        generated = [int(out.logits[0, -1].argmax())]
        position = position[:, -1:] + 1
        for i in range(max_new - 1):
            if generated[-1] in stop_ids:
                break
            out = model(input_ids=torch.tensor([[generated[-1]]]), past_key_values=cache,
                        position_ids=position + i)
            generated.append(int(out.logits[0, -1].argmax()))
    return tokenizer.decode(generated, skip_special_tokens=True)


def wilson(k, n, z=1.959964):
    if n == 0:
        return 0.0, 0.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return 100 * max(0.0, centre - half), 100 * min(1.0, centre + half)


def run_accuracy(args):
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import torch
    import kvpress
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)

    samples = [json.loads(line) for line in open(args.samples, encoding="utf-8") if line.strip()]
    tasks = {s.get("task") for s in samples}
    if len(tasks) != 1 or None in tasks:
        sys.exit(f"{args.samples}: every sample must name one task (kvbench list tasks --export)")
    max_new = task_lengths(args.kvbench)[tasks.pop()]
    methods = ["full"] + [m for m in (args.only or ACCURACY_PRESSES) if m in ACCURACY_PRESSES]
    specs = [(m, r) for m in methods for r in (args.ratios if m != "full" else [None])]

    # kvbench: every method in one session run (one context prefill per sample and request).
    ours_path = os.path.join(args.out, "kvbench.jsonl")
    started = time.time()
    command = [args.kvbench, "--model", args.model, "--threads", str(args.threads), "session",
               "--sample", args.samples, "--mode", "multi-request", "--no-fidelity",
               "--out", ours_path]
    for m, r in specs:
        command += ["--method", kvbench_spec(m, r)]
    if not args.skip_kvbench:
        # As scripts/kvbench does: threads that spin while torch or another job holds a core
        # wait on a preempted thread (docs/speed.md).
        env = dict(os.environ)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env)
        print(f"kvbench: {time.time() - started:.0f} s", flush=True)

    # kvpress: one prefill per sample for every press.
    folder, name = os.path.split(os.path.abspath(args.model))
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    if getattr(model.config, "head_dim", None) is None:  # CriticalKVPress reads it (Qwen2)
        model.config.head_dim = model.config.hidden_size // model.config.num_attention_heads
    head, tail = chat_layout(tokenizer)
    stop_ids = model.generation_config.eos_token_id
    stop_ids = set(stop_ids if isinstance(stop_ids, list) else [stop_ids])
    stop_ids.add(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    # Each sample's answers are appended as it finishes: a rerun resumes after the last one.
    theirs_path = os.path.join(args.out, "kvpress.jsonl")
    done = set()
    if os.path.exists(theirs_path):
        done = {json.loads(line)["sample"] for line in open(theirs_path, encoding="utf-8")}
    for s in samples[:args.max_samples]:
        if s["id"] in done:
            continue
        started = time.time()
        rows = []
        context = encode(tokenizer, head + s["context"] + "\n\n", True)
        n = len(context)
        presses = {}
        for m, r in specs:
            if m == "full":
                continue
            kept = math.ceil(r * n - 1e-9)  # kvbench's count (cache/budget.cpp)
            presses[kvbench_spec(m, r)] = ACCURACY_PRESSES[m](kvpress, 1 - (kept + 0.5) / n)
        multi = MultiPress(model, presses)
        caches = multi.prefill(torch, context)
        for spec, cache in caches.items():
            masks = multi.masks.get(spec, {})
            for t, turn in enumerate(s["multi_turns"], 1):
                query = encode(tokenizer, turn["input"] + tail, False)
                for i, layer in enumerate(model.model.layers):  # this press's, or none
                    layer.self_attn.masked_key_indices = masks.get(i)
                text = answer(torch, model, tokenizer, cache, n, query, max_new, stop_ids)
                rows.append({"sample": s["id"], "method": spec, "turn": t, "prediction": text,
                             "prompt_tokens": n + len(query)})
        with open(theirs_path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))
        print(f"kvpress: sample {s['id']}: {n} context tokens, {time.time() - started:.0f} s",
              flush=True)

    # Both sides scored by kvbench's scorer.
    def score(path):
        run = subprocess.run([args.kvbench, "score", "--sample", args.samples, "--predictions",
                              path], capture_output=True, text=True, check=True)
        return {(r["sample"], r["method"], r["turn"]): r
                for r in map(json.loads, run.stdout.splitlines())}
    ours, theirs = score(ours_path), score(theirs_path)
    # kvbench names its rows by the canonical spec, in the order of the --method options.
    canonical = []
    for key in ours:
        if key[1] not in canonical:
            canonical.append(key[1])
    if len(canonical) != len(specs):
        sys.exit(f"{ours_path}: {len(canonical)} methods, expected {len(specs)}")
    as_spec = dict(zip(canonical, (kvbench_spec(m, r) for m, r in specs)))
    ours = {(k[0], as_spec[k[1]], k[2]): row for k, row in ours.items()}
    print("\n| method | kvbench % [95%] | kvpress % [95%] | same answer | prompt tokens differ |")
    print("|---|---:|---:|---:|---:|")
    for m, r in specs:
        spec = kvbench_spec(m, r)
        keys = [k for k in theirs if k[1] == spec]
        a = sum(ours[k]["score"] for k in keys if k in ours)
        b = sum(theirs[k]["score"] for k in keys)
        same = sum(1 for k in keys if k in ours and
                   ours[k]["prediction"].strip() == theirs[k]["prediction"].strip())
        differ = sum(1 for k in keys if k in ours and
                     ours[k]["prompt_tokens"] != theirs[k]["prompt_tokens"])
        lo_a, hi_a = wilson(a, len(keys))
        lo_b, hi_b = wilson(b, len(keys))
        print(f"| {spec} | {100 * a / len(keys):.0f} [{lo_a:.0f}, {hi_a:.0f}] | "
              f"{100 * b / len(keys):.0f} [{lo_b:.0f}, {hi_b:.0f}] | {same}/{len(keys)} | {differ} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="GGUF file")
    parser.add_argument("--kvbench", default=os.path.join(ROOT, "build", "kvbench"))
    parser.add_argument("--budgets", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="kvbench method names to run (default: all)")
    parser.add_argument("--samples", help="accuracy mode: exported samples (JSONL)")
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.25],
                        help="accuracy mode: kept shares of the context")
    parser.add_argument("--out", default=os.path.join(ROOT, "kvbench-out", "kvpress"),
                        help="accuracy mode: folder for both sides' answers")
    parser.add_argument("--skip-kvbench", action="store_true",
                        help="accuracy mode: reuse the folder's kvbench.jsonl")
    parser.add_argument("--max-samples", type=int, default=None,
                        help="accuracy mode: run kvpress on the first N samples only (the "
                             "table compares those)")
    args = parser.parse_args()
    if args.samples:
        return run_accuracy(args)

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
