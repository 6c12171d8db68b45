#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer_smollm2.json: token ids from llama.cpp for varied strings.

Needs llama-cpp-python (which bundles llama.cpp), the gguf package and the SmolLM2 GGUF:
  python scripts/make_tokenizer_fixtures.py [MODEL.gguf]
Each case holds the text (or, for invalid UTF-8, its bytes in hex) and llama_tokenize's ids
(add_special=true): "ids" with parse_special=true, "ids_no_special" without it, and
"ids_<pre>" for the same vocab under other pre-tokenizers (a metadata-only copy of the model
with tokenizer.ggml.pre replaced), so that every regex set is checked against llama.cpp.
"""

import json
import pathlib
import sys
import tempfile

import gguf
import llama_cpp

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


# Fixture key -> tokenizer.ggml.pre value for the metadata-only copies.
OTHER_PRE = {"ids_gpt2": "gpt-2", "ids_llama3": "llama-bpe", "ids_default": "default"}


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


def main() -> int:
    model = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_MODEL
    load = lambda path: llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    llm = load(model)
    with tempfile.TemporaryDirectory() as tmp:
        others = {}
        for key, pre in OTHER_PRE.items():
            path = pathlib.Path(tmp) / f"{pre}.gguf"
            copy_with_pre(model, path, pre)
            others[key] = load(path)
        cases = []
        for raw in [t.encode() for t in TEXTS] + INVALID:
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
    out = ROOT / "tests/fixtures/tokenizer_smollm2.json"
    doc = {
        "model": model.name,
        "source": f"llama-cpp-python {llama_cpp.__version__}, llama_tokenize(add_special=true)",
        "cases": cases,
    }
    # One case per line keeps the file readable and its diffs small.
    lines = ["{", f' "model": {json.dumps(doc["model"])},', f' "source": {json.dumps(doc["source"])},',
             ' "cases": [']
    lines += ["  " + json.dumps(c, ensure_ascii=False) + ("," if i + 1 < len(cases) else "")
              for i, c in enumerate(cases)]
    lines += [" ]", "}"]
    out.write_text("\n".join(lines) + "\n")
    print(f"make_tokenizer_fixtures: wrote {len(cases)} cases to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
