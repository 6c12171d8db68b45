#!/usr/bin/env python3
"""Writes tokenizer fixtures: token ids from llama.cpp for varied strings, per model.

Needs llama-cpp-python (which bundles llama.cpp), the gguf package and the model's GGUF:
  python scripts/make_tokenizer_fixtures.py [MODEL.gguf] [--out FILE]
The profile follows the GGUF's tokenizer.ggml.pre: "smollm" (SmolLM2, the default model)
writes tests/fixtures/tokenizer_smollm2.json, "qwen2" (Qwen2.5-Coder-0.5B-Instruct)
tests/fixtures/tokenizer_qwen2.json.
Each case holds the text (or, for invalid UTF-8, its bytes in hex) and llama_tokenize's ids
(add_special=true): "ids" with parse_special=true, "ids_no_special" without it, and
"ids_<pre>" for the same vocab under other pre-tokenizers (a metadata-only copy of the model
with tokenizer.ggml.pre replaced), so that every regex set is checked against llama.cpp.
The qwen2 profile also renders conversations with the GGUF's chat template through
llama-cpp-python's Jinja2ChatFormatter ("chats": messages, the rendered text and its ids).
"""

import json
import pathlib
import sys
import tempfile

import gguf
import llama_cpp
import llama_cpp.llama_chat_format

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = [
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "trailing space ",
    "trailing spaces   ",
    "two  spaces and   three",
    "\n",
    "\n\n\n",
    "line one\nline two\n\nline four\n",
    "   \n   indented after newline",
    "tabs\tand\t\ttabs",
    "def f(x):\n    return x + 1\n\n\tif x:\n\t\tpass\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "1234567",
    "3.14 and 2.71828",
    "Price: $1,299.99 (was $2,000)",
    "x1y22z333 42nd 1st",
    "I'll be there, we're ready, it's fine, you've seen, I'm here, he'd go, don't",
    "IT'S LOUD AND WE'LL SHOUT 'S 'T",
    "'ll 're 'S 've",
    "café naïve résumé Ångström",
    "Straße über Öl",
    "日本語のテキストです。",
    "中文文本，包含标点符号！",
    "한국어 텍스트",
    "مرحبا بالعالم",
    "Привет, мир!",
    "Γειά σου Κόσμε",
    "emoji 😀 and 👍🏽",
    "family 👨‍👩‍👧‍👦 zwj",
    "flags 🇫🇷🇯🇵🇺🇸",
    "math ∑ x² ≤ ½ ∞",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|><|im_start|>",
    "<|im_start  not special |im_end|>",
    "a\u00a0non-breaking\u2003em space\u3000ideographic",
    "zero\u200bwidth\u200djoiner",
    "\r\nwindows\r\nline endings\r\n",
    "mixed ١٢٣ Arabic-Indic digits and ⅻ roman",
    "URL https://example.com/path?q=1&r=two#frag",
    "email@example.com, @handle, #hashtag",
    "....!!!???---___===",
    "x  \n  y",
    "a!!\n\nb",
    "end.\n\n\nNext paragraph",
    "Mixed CASE it'S I'M YOU'RE",
    "a+b=c|d^e~f<g>h$i",
    "99 bottles, 100000 bottles, 1234567890123",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "",
]

# Invalid UTF-8, as bytes.
INVALID = [
    b"bad \xff byte",
    b"truncated \xe6\x97",
    b"\x80\x80 lone continuation",
    b"overlong \xc0\xaf",
    b"ok \xf0\x9f\x98 cut emoji",
]


# Qwen2.5's pre-tokenizer splits numbers one digit at a time and its vocab has 151k tokens
# with 22 special ones: digit runs, identifiers with digits, code, scripts and the ChatML,
# FIM and tool markup.
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# About 1,700 tokens of prose, numbers and code.
QWEN_LONG = "".join(
    f"Section {i}: the cache kept {i * 37 % 1000} of {1024 + i} tokens (ratio {i / 7:.4f}); "
    f"see https://example.com/run/{i:04d}?seed={i * 7919}.\n"
    f"    def step_{i}(x):\n        return x * {i} + 0x{i * 2654435761 % 2**32:08x}  # it's fine\n\n"
    for i in range(40)
)

QWEN_TEXTS = [
    "12345",
    "3.14159",
    "1234567890",
    "0.000001 1e-9 6.022e23 -42 +17",
    "1,234,567.89 and 98.6%",
    "123e4567-e89b-12d3-a456-426614174000",
    "550E8400-E29B-41D4-A716-446655440000",
    "2024-01-15T10:30:00Z, 23:59:59.999",
    "v1.2.3-rc4 python3.11 x86_64 sha256:9f86d081884c7d65",
    "0xDEADBEEF 0b1010 0o777 1_000_000",
    "第１０章，２０２４年",
    "１０ ２０ １０２０ ２０１０ 10 20",
    "x² + y³ = z⁴, ½ ¼ ¾",
    "Ⅻ ⅻ ① ⑳ ١٢٣٤ ۱۲۳ १२३",
    "1️⃣ 2️⃣ #️⃣",
    "I'm you're he's we've they'll she'd can't",
    "I'M YOU'RE HE'S WE'VE THEY'LL SHE'D CAN'T",
    "it’s curly, ''s 's' 'll' rock'n'roll o'clock",
    "year's 1990's '90s",
    "class Cache:\n    \"\"\"LRU cache.\"\"\"\n\n    def __init__(self, size: int = 128) -> None:\n"
    "        self.size = size\n        self.items: dict[str, bytes] = {}\n\n"
    "    def get(self, key):\n        return self.items.get(key, None)  # O(1)\n",
    "template <typename T>\nstd::vector<T> top_k(const std::vector<T>& v, size_t k) {\n"
    "  auto out = v;\n  std::partial_sort(out.begin(), out.begin() + k, out.end());\n"
    "  return {out.begin(), out.begin() + k};\n}\n",
    "const f = (a, b) => a ?? b; let s = `${x}px`; arr.map(x => x ** 2);",
    '{"id": 42, "name": "kv", "tags": ["a", "b"], "ratio": 0.125, "ok": true, "n": null}',
    "SELECT id, COUNT(*) FROM t WHERE ts >= '2024-01-01' GROUP BY 1 HAVING COUNT(*) > 10;",
    "for f in *.gguf; do sha256sum \"$f\" | cut -c1-16; done 2>/dev/null && echo ok",
    "fn main() -> Result<(), Box<dyn Error>> {\n\tlet v: Vec<u8> = vec![0; 16];\n\tOk(())\n}",
    "\t\t\tdeep\n\t\t\t\n\t\tback",
    "a\u000bb\u000cc",
    "line\u2028sep\u2029para",
    "x\u00a0\u00a0y \u3000z",
    "    ",
    "\n \n \n",
    "end   \n",
    "\n\n\n\n\n\nsix newlines",
    "ctrl \x00\x01\x1f\x7f chars",
    "ภาษาไทย ใช้สระ",
    "हिन्दी भाषा में 2024",
    "שלום עולם",
    "e\u0301 a\u0308 n\u0303 combining",
    "ǅungla Ǆ ǆ",
    "Tiếng Việt có dấu",
    "東京は2024年に人口1400万人",
    "한국어 2024년 10월",
    "👩🏽‍💻 🏳️‍🌈 ❤️ ✔️ 🤖🤖🤖",
    "text😀text😀",
    "<|im_start|>system\n" + QWEN_SYSTEM + "<|im_end|>\n<|im_start|>user\n"
    "Write 12345 in words.<|im_end|>\n<|im_start|>assistant\n",
    "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c<|fim_middle|>",
    "<|repo_name|>kvbench\n<|file_sep|>src/main.cpp\nint main() {}<|fim_pad|>",
    '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>',
    "<tool_call><tool_call>x</tool_call>",
    "<|vision_start|><|image_pad|><|vision_end|><|video_pad|>",
    "<|object_ref_start|>cat<|object_ref_end|><|box_start|>(1,2)<|box_end|>",
    "<|endoftext|><|endoftext|>",
    "[PAD151665] is an unused token",
    "<|im_end|>x<|im_end <|im_start|>",
    "<think>\nreasoning\n</think>",
    QWEN_LONG,
]

# Conversations rendered with the GGUF's template (messages, add_generation_prompt).
QWEN_CHATS = [
    ([{"role": "user", "content": "What is 2+2?"}], True),
    ([{"role": "user", "content": "What is 2+2?"}], False),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], True),
    ([{"role": "user", "content": "Count to 3."}, {"role": "assistant", "content": "1, 2, 3."},
      {"role": "user", "content": " And to 10?\n"}], True),
]

PROFILES = {
    "smollm": {
        "out": "tests/fixtures/tokenizer_smollm2.json",
        "texts": TEXTS,
        # Fixture key -> tokenizer.ggml.pre value for the metadata-only copies.
        "other_pre": {"ids_gpt2": "gpt-2", "ids_llama3": "llama-bpe", "ids_default": "default"},
        "chats": [],
    },
    "qwen2": {
        "out": "tests/fixtures/tokenizer_qwen2.json",
        "texts": TEXTS + QWEN_TEXTS,
        # llama3's \p{N}{1,3} on this vocab differs from qwen2 only where a multi-digit token
        # exists ("１０", "２０"); it also checks llama3's ignore_merges on a large vocab.
        "other_pre": {"ids_llama3": "llama-bpe"},
        "chats": QWEN_CHATS,
    },
}


def copy_with_pre(src: pathlib.Path, dst: pathlib.Path, pre: str) -> None:
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), arch=reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = pre if name == "tokenizer.ggml.pre" else field.contents()
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, kind, sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def render_chats(model: pathlib.Path, llm, chats) -> list:
    if not chats:
        return []
    fields = gguf.GGUFReader(str(model)).fields
    template = fields["tokenizer.chat_template"].contents()
    token = lambda key: llm.detokenize([fields[key].contents()], special=True).decode()
    out = []
    for messages, add_generation_prompt in chats:
        formatter = llama_cpp.llama_chat_format.Jinja2ChatFormatter(
            template, eos_token=token("tokenizer.ggml.eos_token_id"),
            bos_token=token("tokenizer.ggml.bos_token_id"),
            add_generation_prompt=add_generation_prompt)
        text = formatter(messages=messages).prompt
        out.append({"messages": messages, "add_generation_prompt": add_generation_prompt,
                    "text": text, "ids": llm.tokenize(text.encode(), add_bos=True, special=True)})
    return out


def main() -> int:
    args = sys.argv[1:]
    out_arg = None
    if "--out" in args:
        at = args.index("--out")
        out_arg = pathlib.Path(args[at + 1])
        del args[at:at + 2]
    model = pathlib.Path(args[0]) if args else DEFAULT_MODEL
    pre = gguf.GGUFReader(str(model)).fields["tokenizer.ggml.pre"].contents()
    if pre not in PROFILES:
        print(f"make_tokenizer_fixtures: no profile for tokenizer.ggml.pre '{pre}' "
              f"(have: {', '.join(PROFILES)})", file=sys.stderr)
        return 2
    profile = PROFILES[pre]
    load = lambda path: llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    llm = load(model)
    with tempfile.TemporaryDirectory() as tmp:
        others = {}
        for key, other_pre in profile["other_pre"].items():
            path = pathlib.Path(tmp) / f"{other_pre}.gguf"
            copy_with_pre(model, path, other_pre)
            others[key] = load(path)
        cases = []
        for raw in [t.encode() for t in profile["texts"]] + INVALID:
            case = {}
            try:
                case["text"] = raw.decode("utf-8")
            except UnicodeDecodeError:
                case["hex"] = raw.hex()
            case["ids"] = llm.tokenize(raw, add_bos=True, special=True)
            case["ids_no_special"] = llm.tokenize(raw, add_bos=True, special=False)
            for key, other in others.items():
                case[key] = other.tokenize(raw, add_bos=True, special=True)
            cases.append(case)
    chats = render_chats(model, llm, profile["chats"])
    out = out_arg or ROOT / profile["out"]
    doc = {
        "model": model.name,
        "source": f"llama-cpp-python {llama_cpp.__version__}, llama_tokenize(add_special=true)",
    }
    # One case per line keeps the file readable and its diffs small.
    lines = ["{", f' "model": {json.dumps(doc["model"])},', f' "source": {json.dumps(doc["source"])},',
             ' "cases": [']
    lines += ["  " + json.dumps(c, ensure_ascii=False) + ("," if i + 1 < len(cases) else "")
              for i, c in enumerate(cases)]
    if chats:
        lines += [" ],", ' "chats": [']
        lines += ["  " + json.dumps(c, ensure_ascii=False) + ("," if i + 1 < len(chats) else "")
                  for i, c in enumerate(chats)]
    lines += [" ]", "}"]
    out.write_text("\n".join(lines) + "\n")
    n_tokens = sum(len(c["ids"]) for c in cases)
    print(f"make_tokenizer_fixtures: wrote {len(cases)} cases ({n_tokens} tokens) and "
          f"{len(chats)} chats to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
