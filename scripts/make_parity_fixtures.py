#!/usr/bin/env python3
"""Make llama.cpp reference fixtures (tokens, top-8 logits per position, greedy
continuations) for kvbench's C++ model parity tests.

  scripts/make_parity_fixtures.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
      --out tests/fixtures/parity_smollm2.json
  scripts/make_parity_fixtures.py --model models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf \
      --out tests/fixtures/parity_qwen2.json

Needs a venv with llama-cpp-python==0.3.36 (see scripts/reference_venv.sh).
The project itself never depends on Python; this only regenerates the fixture.

How the logits are produced: llama_cpp.Llama(n_ctx=2048, n_batch=512,
logits_all=True, n_threads=2, flash_attn=False, KV cache f16 (default)),
llm.reset(); llm.eval(prompt_tokens) -> llm.scores[i] = logits after token i.
So prompts longer than n_batch are evaluated in ubatches of 512 tokens.
Greedy: argmax of the last prompt position, then the chosen token is fed back
one token at a time (llm.eval([t])) for n_greedy steps; EOS does not stop it.
Chat prompts are rendered with the GGUF's own chat template
(tokenizer.chat_template, with jinja2 as transformers' apply_chat_template does), so
each model gets its own default system prompt.
Note llama.cpp quantizes activations to 8 bits (q8_1 / q8_0 / q8_K, by weight type)
for the quantized matmuls and keeps K/V in f16, so these logits are NOT exact fp32 math on the
dequantized weights; see scripts/numpy_reference_forward.py for the gap.
"""
import argparse
import hashlib
import json
import os
import platform
import sys
import time

import numpy as np

TOPK = 8


def chat_renderer(template):
    """Renders a list of (role, content) turns with the model's chat template, the way
    transformers' apply_chat_template does (sandboxed jinja2, trim/lstrip blocks), so the
    default system prompt is the model's own (SmolLM2: "You are a helpful AI assistant named
    SmolLM, ...", Qwen2.5: "You are Qwen, created by Alibaba Cloud. ...")."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise ValueError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    tpl = env.from_string(template)

    def render(turns, add_generation_prompt=True):
        messages = [{"role": role, "content": content} for role, content in turns]
        return tpl.render(messages=messages, add_generation_prompt=add_generation_prompt)

    return render


CODE = (
    "import os\n"
    "\n"
    "\n"
    "class Counter:\n"
    "    \"\"\"Count words in files.\"\"\"\n"
    "\n"
    "    def __init__(self, root: str) -> None:\n"
    "        self.root = root\n"
    "        self.counts = {}\n"
    "\n"
    "    def run(self):\n"
    "        for dirpath, _, names in os.walk(self.root):\n"
    "\tfor name in names:  # a tab-indented line\n"
    "\t\tif name.endswith(('.txt', '.md')):\n"
    "\t\t\twith open(os.path.join(dirpath, name)) as f:\n"
    "\t\t\t\tfor w in f.read().split():\n"
    "\t\t\t\t\tself.counts[w] = self.counts.get(w, 0) + 1\n"
    "        return sorted(self.counts.items(), key=lambda kv: -kv[1])[:10]\n"
    "\n"
    "if __name__ == '__main__':\n"
    "    print(Counter('.').run())\n"
)

# Paragraphs of ordinary prose for the ~1000-token prompt (written for this
# fixture; deterministic).  Sentences are appended in order until the token
# count reaches LONG_TARGET; if the paragraphs run out, they are reused with a
# varied lead-in.
LONG_PARAGRAPHS = [
    "The old lighthouse on the northern cape had not been used for almost forty years, but every evening "
    "at dusk the villagers still looked toward it, as if they expected the lamp to turn once more. "
    "Its white paint had faded to the color of weathered bone, and the iron railing around the gallery "
    "was streaked with rust. Children dared each other to climb the spiral staircase, which counted one "
    "hundred and twelve steps, and most of them gave up somewhere near the seventieth.",
    "Maria, who ran the bakery beside the harbor, remembered the last keeper well. He was a quiet man "
    "named Tomas who bought two loaves of rye bread every Tuesday and paid with coins he had polished "
    "until they shone. He rarely spoke about his work, but once, during a storm that lasted three days, "
    "he told her that the light was not really for the ships. It was for the people on shore, he said, "
    "so that they would know someone was still awake.",
    "Scientists who study coastal erosion have measured that the cliff beneath the lighthouse loses "
    "roughly thirty centimeters every year. The rate is not constant; a single winter storm can remove "
    "more rock than a decade of calm weather. Engineers proposed several plans to protect the structure, "
    "including a concrete sea wall and a field of large granite blocks, but each plan was more expensive "
    "than the town could afford, and the discussions always ended without a decision.",
    "In the spring, a group of students from the university arrived with notebooks, cameras, and a small "
    "drone. They spent two weeks mapping the cliff, interviewing residents, and collecting stories about "
    "the building. One student, a young woman from the city, discovered a box of letters in the keeper's "
    "cottage. The letters were written by Tomas to his sister, and they described the sea in every season "
    "with a patience that surprised everyone who read them.",
    "\"The water in February is the color of slate,\" he wrote in one letter, \"and it moves as if it were "
    "tired. In August it turns green near the rocks and almost black farther out, where the fishing boats "
    "wait for the tide. I have learned to tell the weather from the sound of the bell buoy. When it rings "
    "slowly, the night will be calm. When it rings quickly and without rhythm, I stay by the lamp until "
    "morning.\"",
    "The letters changed the way the town thought about the lighthouse. What had been an old building "
    "became a record of a life spent paying attention. The mayor organized a meeting in the school hall, "
    "and more people came than anyone had expected. Fishermen, teachers, shop owners, and retired sailors "
    "stood along the walls because there were not enough chairs, and they argued late into the night "
    "about what should be done.",
    "Some wanted to restore the lamp and turn the tower into a museum. Others believed it was wiser to let "
    "the sea take it slowly and to spend the money on the harbor, which needed a new pier. A few suggested "
    "moving the entire lighthouse inland, stone by stone, as had been done with other historic buildings "
    "in distant countries. That idea sounded impossible at first, yet the more people talked about it, "
    "the less impossible it seemed.",
    "An engineer from the capital visited in June and walked around the tower with a tape measure and a "
    "worried expression. She explained that moving the structure would require cutting it free from its "
    "foundation, lifting it onto steel beams, and rolling it along a prepared track at a speed of only a "
    "few meters per hour. The work would take most of a summer, and it would cost less than the sea wall, "
    "but it carried a real risk that the old masonry would crack.",
    "After a long debate, the town voted to try. Volunteers cleared a path through the meadow, and local "
    "farmers lent their tractors to move gravel. Every morning a crowd gathered to watch the tower advance "
    "a little farther from the edge. Children measured its progress with chalk marks on the road, and the "
    "bakery sold small bread rolls shaped like lighthouses, which Maria said was the best idea she had "
    "ever had.",
    "By the end of August the lighthouse stood eighty meters from the cliff, on solid ground, facing the "
    "same stretch of sea it had watched for more than a century. On the first clear evening in September, "
    "an electrician connected a new lamp to the old lens. When the light swept across the water for the "
    "first time in forty years, nobody in the crowd said anything at all. They simply stood there, "
    "listening to the bell buoy ring slowly in the dark, and understood what Tomas had meant.",
]
LONG_TARGET = 1000


def sentences(par):
    out, cur = [], ""
    for i, ch in enumerate(par):
        cur += ch
        if ch in ".!?" and (i + 1 == len(par) or par[i + 1] == " "):
            out.append(cur)
            cur = ""
    if cur:
        out.append(cur)
    return out


def compose_long_text(tokenize):
    """Deterministic ~LONG_TARGET-token English text (stops at the first sentence
    boundary at or beyond LONG_TARGET - 25 tokens)."""
    text = ""
    rounds = 0
    while True:
        for pi, par in enumerate(LONG_PARAGRAPHS):
            lead = "" if rounds == 0 else "Years later, people still told the story. "
            sents = sentences(lead + par) if pi == 0 or rounds == 0 else sentences(par)
            for si, s in enumerate(sents):
                sep = "" if not text else ("\n\n" if si == 0 else "")
                text += sep + s
                if len(tokenize(text)) >= LONG_TARGET - 25:
                    return text
        rounds += 1


def prompts(tokenize, chat):
    ps = [
        ("plain_question", "What is the tallest mountain in the world, and how was its height measured?"),
        ("chat_capital", chat([("user", "What is the capital of France?")])),
        # No system turn: both templates insert their default system prompt.
        ("chat_multiturn", chat([("user", "Give me a word that rhymes with cat."),
                                 ("assistant", "Hat."),
                                 ("user", "Now use it in a short sentence.")])),
        ("unicode", "Café, naïve, résumé, façade — São Paulo. Größenwahn und Übermut: die Straße "
                    "ist schön. 日本語のテキストです。中文文本：你好，世界！한국어도 있어요. "
                    "Привет, как дела? Ελληνικά: καλημέρα. Zürich ≠ Zurich ± 1°C."),
        ("emoji", "I love 🍕 and 🎉! Family: 👨‍👩‍👧‍👦, couple 👩‍❤️‍👨, flags 🇫🇷🇩🇪🇯🇵, "
                  "thumbs 👍🏽👍🏿, fire heart ❤️‍🔥, rainbow flag 🏳️‍🌈, astronaut 🧑‍🚀. Done ✅"),
        ("python_code", CODE),
        ("whitespace", "Line one.\n\n\nLine   two   with    runs     of spaces.\n\t\tTwo tabs here.\n"
                       "    \n  \t  \n\n\n\nAfter four newlines.   Trailing spaces   \n \n"
                       "          ten spaces, then end."),
        ("digits", "In 2024, 3.14159 × 1,000,000 = 3141590; call 555-0123 or +1 (800) 123-4567. "
                   "Values: 0x1F, 0b1011, 1e-9, -42, 007, 12345678901234567890, 99.999%, 1/3 ≈ 0.333, "
                   "dates 2023-12-31 and 31.12.2023, time 23:59:59."),
    ]
    ps.append(("long_1k", compose_long_text(tokenize)))
    return ps


def topk(row, k=TOPK):
    row = np.asarray(row, dtype=np.float32)
    idx = np.argpartition(-row, k)[:k]
    # sort by value desc, ties by id asc
    order = np.lexsort((idx, -row[idx]))
    idx = idx[order]
    return [int(i) for i in idx], [round(float(row[i]), 5) for i in idx]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def dump(obj, path):
    """Top-level keys one per line, each prompt on one line, no indentation of arrays."""
    c = dict(separators=(",", ":"), ensure_ascii=False)
    lines = ["{"]
    keys = list(obj.keys())
    for i, k in enumerate(keys):
        end = "," if i + 1 < len(keys) else ""
        if k == "prompts":
            lines.append(json.dumps(k) + ":[")
            for j, p in enumerate(obj[k]):
                lines.append(json.dumps(p, **c) + ("," if j + 1 < len(obj[k]) else ""))
            lines.append("]" + end)
        else:
            lines.append(json.dumps(k) + ":" + json.dumps(obj[k], **c) + end)
    lines.append("}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default="tests/fixtures/parity_smollm2.json")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-batch", type=int, default=512)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--n-greedy", type=int, default=32)
    a = ap.parse_args()

    import llama_cpp
    t0 = time.time()
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=a.n_ctx, n_batch=a.n_batch, logits_all=True,
                          n_threads=a.threads, seed=0, verbose=False, flash_attn=False)
    tok = lambda s: llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)
    eos = llm.token_eos()
    template = llm.metadata.get("tokenizer.chat_template")
    if not template:
        sys.exit(f"{a.model} has no tokenizer.chat_template")
    out_prompts = []
    for name, text in prompts(tok, chat_renderer(template)):
        ids = tok(text)
        llm.reset()
        llm.eval(ids)
        sc = np.asarray(llm.scores[: len(ids)], dtype=np.float32)
        tids, tvals = zip(*(topk(r) for r in sc))
        g, dec_ids, dec_vals = [], [], []
        nxt = int(np.argmax(sc[-1]))
        for step in range(a.n_greedy):
            g.append(nxt)
            if step + 1 == a.n_greedy:
                break
            llm.eval([nxt])
            row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            i8, v8 = topk(row)
            dec_ids.append(i8)
            dec_vals.append(v8)
            nxt = int(np.argmax(row))
        piece = llm.detokenize(g).decode("utf-8", errors="replace")
        out_prompts.append({
            "name": name,
            "text": text,
            "n_tokens": len(ids),
            "tokens": ids,
            "top_ids": list(tids),
            "top_logits": list(tvals),
            "greedy": {"ids": g, "text": piece, "eos_at": g.index(eos) if eos in g else -1,
                       "decode_top_ids": dec_ids, "decode_top_logits": dec_vals},
        })
        print(f"{name}: {len(ids)} tokens, greedy={piece[:60]!r}", file=sys.stderr, flush=True)

    fx = {
        "schema": "kvbench.parity.v1",
        "description": (
            "llama.cpp reference for the C++ model. Per prompt: tokens = llm.tokenize(text.encode('utf-8'), "
            "add_bos=False, special=True); top_ids/top_logits[i] = top-8 (value desc, ties id asc) of the logits "
            "after tokens[0..i], prompt evaluated with one llm.eval(tokens) call into an empty cache (ubatches "
            "of n_batch); values rounded to 5 decimals. greedy.ids = 32 greedy tokens: ids[0] = argmax of the "
            "last prompt position, then each chosen token is fed back alone (single-token decode); "
            "decode_top_ids/decode_top_logits[k] = top-8 after feeding ids[k] (so ids[k+1] = decode_top_ids[k][0]); "
            "generation does NOT stop at EOS (eos_at = first index of EOS in ids, -1 if none)."),
        "generation": {
            "engine": "llama.cpp via llama-cpp-python",
            "llama_cpp_python_version": llama_cpp.__version__,
            "n_threads": a.threads, "n_batch": a.n_batch, "n_ubatch": min(a.n_batch, 512), "n_ctx": a.n_ctx,
            "kv_cache_type": "f16 (default type_k/type_v)", "flash_attn": False, "logits_all": True,
            "seed": 0, "add_bos": False, "special": True, "topk": TOPK, "greedy_steps": a.n_greedy,
            "greedy_stops_at_eos": False, "backend": "CPU",
            "cpu": platform.processor() or platform.machine(),
            "notes": "llama.cpp quantizes activations to 8 bits for the quantized matmuls (q8_1 for Q4_1, "
                     "q8_0 for Q5_0/Q8_0, q8_K for Q4_K/Q6_K weights) and stores K/V in f16; logits are not "
                     "exact fp32 math on dequantized weights.",
        },
        "model": {"file": os.path.basename(a.model), "sha256": sha256(a.model),
                  "bos_id": llm.token_bos(), "eos_id": eos, "n_vocab": llm.n_vocab()},
        "prompts": out_prompts,
    }
    dump(fx, a.out)
    print(f"wrote {a.out} ({os.path.getsize(a.out)/1e6:.2f} MB) in {time.time()-t0:.0f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
