#!/usr/bin/env python3
"""Independent fp32 (or fp64) numpy forward pass of a llama- or qwen2-architecture GGUF model.

Second reference for kvbench's C++ model, independent of llama.cpp:
  * all weights are dequantized to float32 with the `gguf` package (exact
    dequantization of Q4_1 / Q5_0 / Q8_0 / Q4_K / Q6_K blocks, no activation quantization),
  * activations, attention and the KV cache stay in float32 (or float64 with
    --dtype float64), unlike llama.cpp, which quantizes activations to q8_1/q8_0/q8_K
    for the quantized matmuls and stores the KV cache in f16.

Architecture (what llama.cpp's LLM_ARCH_LLAMA / LLM_ARCH_QWEN2 graphs do):
  x = token_embd[tok]
  per layer: h = rmsnorm(x) * attn_norm
             q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv); RoPE on q, k; causal GQA
             attention, scale 1/sqrt(head_dim); x += Wo attn
             h = rmsnorm(x) * ffn_norm;  x += Wdown(silu(Wgate h) * Wup h)
  logits = token_embd (tied, or output.weight if present) @ (rmsnorm(x) * output_norm)
The q/k/v biases exist only in qwen2 files (blk.N.attn_{q,k,v}.bias); rms eps and the
RoPE base come from the file's metadata ({arch}.attention.layer_norm_rms_epsilon,
{arch}.rope.freq_base).

RoPE, both rotating pair i by angle pos * base^(-2i/n_rot):
  * llama uses LLAMA_ROPE_TYPE_NORM ("normal"): adjacent pairs (x[2i], x[2i+1])
    (ggml-cpu ops.cpp rotate_pairs with n_offset=1).  convert_hf_to_gguf permutes the HF
    q/k rows (HF uses the "half" rotation) so that the interleaved form is correct for
    GGUF files.
  * qwen2 uses LLAMA_ROPE_TYPE_NEOX: pairs (x[i], x[i + n_rot/2]) (rotate_pairs with
    n_offset=n_rot/2, HF's rotate_half); its GGUF q/k rows are stored unpermuted, and this
    script applies the rotation that way (kvbench instead permutes the rows at load and
    uses its interleaved RoPE: the two must agree).

Usage:
  numpy_reference_forward.py --model M.gguf --text "Hello"          # prints top-5 of last position
  numpy_reference_forward.py --model M.gguf --fixture tests/fixtures/parity_smollm2.json
      # compares with the llama.cpp fixture (top-8 logits at every position)
  ... --fixture F --llama   # additionally re-runs llama.cpp (llama_cpp module) for full-vocab diffs
"""
import argparse
import json
import math
import sys
import time

import numpy as np

try:
    from gguf import GGUFReader
    from gguf.quants import dequantize
except ImportError:  # pragma: no cover
    sys.exit("needs the `gguf` package (pip install gguf numpy)")


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


# Architectures this forward runs, and whether each rotates NeoX-style (llama.cpp's
# llama_model_rope_type: LLAMA_ROPE_TYPE_NORM for llama, LLAMA_ROPE_TYPE_NEOX for qwen2).
ROPE_NEOX = {"llama": False, "qwen2": True}

# Weight types --emulate-llamacpp knows the activation rounding of (q8_1 / q8_0 activations).
EMULATED_TYPES = ("F32", "Q4_1", "Q8_0")


class LlamaNumpy:
    def __init__(self, path, dtype=np.float32, emulate=False):
        """emulate=True mimics llama.cpp CPU numerics: activations quantized to q8_1
        (blocks of 32, fp16 scale d and fp16 s=d*sum(q)) before Q4_1 matmuls and to
        q8_0 before Q8_0 matmuls, K/V cache and Q rounded to f16 for K*Q, softmax
        probabilities rounded to f16 for V*P (non-flash-attention CPU path)."""
        self.dtype = dtype
        self.emulate = emulate
        self.qtype = {}
        self.qmin = {}
        r = GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch not in ROPE_NEOX:
            raise ValueError(f"architecture {arch!r} is not one of {sorted(ROPE_NEOX)}")
        self.arch = arch
        self.rope_neox = ROPE_NEOX[arch]
        p = arch + "."
        self.n_layer = int(_field(r, p + "block_count"))
        self.n_embd = int(_field(r, p + "embedding_length"))
        self.n_head = int(_field(r, p + "attention.head_count"))
        self.n_head_kv = int(_field(r, p + "attention.head_count_kv", self.n_head))
        self.eps = float(_field(r, p + "attention.layer_norm_rms_epsilon"))
        self.rope_base = float(_field(r, p + "rope.freq_base", 10000.0))
        self.head_dim = self.n_embd // self.n_head
        self.n_rot = int(_field(r, p + "rope.dimension_count", self.head_dim))
        self.w = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type)
            # numpy shape is (ne1, ne0) = (out, in) for matrices
            self.w[t.name] = np.ascontiguousarray(a.reshape([int(x) for x in reversed(t.shape)])).astype(dtype)
            self.qtype[t.name] = t.tensor_type.name
            if t.tensor_type.name == "Q4_1":
                # block_q4_1 = {f16 d; f16 m; u8 qs[16]}: keep m per block for the q8_1 s-term
                raw = np.asarray(t.data).reshape(self.w[t.name].shape[0], -1, 20)
                self.qmin[t.name] = np.ascontiguousarray(raw[:, :, 2:4]).view(np.float16)[..., 0].astype(dtype)
        if emulate:
            other = sorted({q for q in self.qtype.values() if q not in EMULATED_TYPES})
            if other:
                raise ValueError(f"--emulate-llamacpp does not know llama.cpp's activation rounding for {other}")
        self.tok_embd = self.w["token_embd.weight"]
        self.out_w = self.w.get("output.weight", self.tok_embd)
        self.n_vocab = self.tok_embd.shape[0]
        i = np.arange(self.n_rot // 2, dtype=np.float64)
        self.inv_freq = self.rope_base ** (-2.0 * i / self.n_rot)
        self.reset()

    def reset(self):
        self.k_cache = [np.zeros((0, self.n_head_kv, self.head_dim), self.dtype) for _ in range(self.n_layer)]
        self.v_cache = [np.zeros((0, self.n_head_kv, self.head_dim), self.dtype) for _ in range(self.n_layer)]
        self.n_past = 0

    def _mm(self, x, name):
        """x (T, in) @ W(name).T, optionally with llama.cpp's activation quantization."""
        W = self.w[name]
        if not self.emulate or self.qtype[name] not in ("Q4_1", "Q8_0"):
            return x @ W.T
        T, n = x.shape
        xb = x.reshape(T, n // 32, 32).astype(np.float32)
        amax = np.abs(xb).max(axis=2, keepdims=True)
        d = amax / np.float32(127)
        with np.errstate(divide="ignore", invalid="ignore"):
            idv = np.where(d > 0, np.float32(1) / d, np.float32(0))
        q = np.rint(xb * idv)  # ties-to-even like the AVX2 path (_mm256_round_ps NEAREST)
        d16 = d.astype(np.float16).astype(np.float32)
        xq = (q * d16).reshape(T, n).astype(self.dtype)
        y = xq @ W.T
        if self.qtype[name] == "Q4_1":
            sumq = q.sum(axis=2)  # (T, nb)
            s16 = (d[..., 0] * sumq).astype(np.float16).astype(np.float32)
            corr = (s16 - d16[..., 0] * sumq).astype(self.dtype)  # s8 - sum(x')
            y = y + corr @ self.qmin[name].T
        return y

    def _f16(self, a):
        return a.astype(np.float16).astype(self.dtype) if self.emulate else a

    def _rms(self, x, w):
        ms = np.mean(x * x, axis=-1, keepdims=True)
        return (x / np.sqrt(ms + self.eps)) * w

    def _rope(self, x, pos):
        # x: (T, H, D); rotate pairs (x[a_i], x[b_i]) by pos * inv_freq[i]
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]  # (T, n_rot/2)
        c = np.cos(ang).astype(self.dtype)[:, None, :]
        s = np.sin(ang).astype(self.dtype)[:, None, :]
        out = x.copy()
        if self.rope_neox:  # NeoX: first half paired with second half of the rotated dims
            half = self.n_rot // 2
            a, b = slice(0, half), slice(half, self.n_rot)
        else:  # normal: adjacent pairs
            a, b = slice(0, self.n_rot, 2), slice(1, self.n_rot, 2)
        x0 = x[..., a]
        x1 = x[..., b]
        out[..., a] = x0 * c - x1 * s
        out[..., b] = x0 * s + x1 * c
        return out

    def _proj(self, h, name):
        """Linear layer blk.N.<name>: weight, plus the bias where the file has one (qwen2 q/k/v)."""
        y = self._mm(h, name + ".weight")
        bias = self.w.get(name + ".bias")
        return y if bias is None else y + bias

    def forward(self, tokens):
        """Appends tokens to the cache; returns logits (len(tokens), n_vocab)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        T = len(tokens)
        H, HKV, D = self.n_head, self.n_head_kv, self.head_dim
        grp = H // HKV
        pos = np.arange(self.n_past, self.n_past + T)
        x = self.tok_embd[tokens].astype(self.dtype)
        scale = self.dtype(1.0 / math.sqrt(D))
        for l in range(self.n_layer):
            w = lambda n: self.w[f"blk.{l}.{n}.weight"]
            h = self._rms(x, w("attn_norm"))
            pre = f"blk.{l}."
            q = self._proj(h, pre + "attn_q").reshape(T, H, D)
            k = self._proj(h, pre + "attn_k").reshape(T, HKV, D)
            v = self._f16(self._proj(h, pre + "attn_v").reshape(T, HKV, D))
            q = self._f16(self._rope(q, pos))
            k = self._f16(self._rope(k, pos))
            K = np.concatenate([self.k_cache[l], k], axis=0)
            V = np.concatenate([self.v_cache[l], v], axis=0)
            self.k_cache[l], self.v_cache[l] = K, V
            S = K.shape[0]
            # causal mask: query at pos p sees keys 0..p
            mask = np.arange(S)[None, :] > pos[:, None]  # (T, S)
            att_out = np.empty((T, H, D), self.dtype)
            for hh in range(H):
                kv = hh // grp
                sc = (q[:, hh, :] @ K[:, kv, :].T) * scale  # (T, S)
                sc = np.where(mask, -np.inf, sc)
                sc = sc - sc.max(axis=1, keepdims=True)
                e = np.exp(sc)
                pr = e / e.sum(axis=1, keepdims=True)
                att_out[:, hh, :] = self._f16(pr) @ V[:, kv, :]
            x = x + self._mm(att_out.reshape(T, H * D), pre + "attn_output.weight")
            h = self._rms(x, w("ffn_norm"))
            g = self._mm(h, pre + "ffn_gate.weight")
            u = self._mm(h, pre + "ffn_up.weight")
            x = x + self._mm((g / (1 + np.exp(-g))) * u, pre + "ffn_down.weight")
        self.n_past += T
        h = self._rms(x, self.w["output_norm.weight"])
        return self._mm(h, "output.weight" if "output.weight" in self.w else "token_embd.weight")

    def greedy(self, tokens, n):
        self.reset()
        lg = self.forward(tokens)[-1]
        out = []
        for _ in range(n):
            t = int(np.argmax(lg))
            out.append(t)
            lg = self.forward([t])[-1]
        return out


def _pct(a, q):
    return float(np.percentile(a, q)) if len(a) else float("nan")


def compare_fixture(m, fx, with_llama=False, model_path=None, quiet=False):
    llm = None
    if with_llama:
        import llama_cpp
        g = fx["generation"]
        llm = llama_cpp.Llama(model_path=model_path, n_ctx=g["n_ctx"], n_batch=g["n_batch"],
                              logits_all=True, n_threads=g["n_threads"], seed=0, verbose=False)
    all_top8 = []
    all_full = []
    top1_agree = 0
    top1_total = 0
    per_prompt = []
    for p in fx["prompts"]:
        toks = p["tokens"]
        m.reset()
        t0 = time.time()
        lg = m.forward(toks)
        ids = np.asarray(p["top_ids"])
        vals = np.asarray(p["top_logits"], dtype=np.float64)
        ours = np.take_along_axis(lg.astype(np.float64), ids, axis=1)
        d = np.abs(ours - vals)
        all_top8.append(d.ravel())
        am = np.argmax(lg, axis=1)
        agree = int(np.sum(am == ids[:, 0]))
        top1_agree += agree
        top1_total += len(toks)
        # near-tie positions: llama's top-1 and top-2 within 0.05
        margin = vals[:, 0] - vals[:, 1]
        rec = {"name": p["name"], "n_tokens": len(toks), "top8_max": float(d.max()),
               "top8_p50": _pct(d, 50), "top8_p99": _pct(d, 99),
               "top1_agree": agree, "top1_disagree_margins": [round(float(x), 4) for x in margin[am != ids[:, 0]]]}
        if llm is not None:
            llm.reset()
            llm.eval(toks)
            full = np.asarray(llm.scores[: len(toks)], dtype=np.float64)
            fd = np.abs(full - lg)
            all_full.append(fd.ravel())
            rec["full_max"] = float(fd.max())
            rec["full_p99"] = _pct(fd, 99)
        if "greedy" in p:
            gref = p["greedy"]["ids"]
            gour = m.greedy(toks, len(gref))
            k = 0
            while k < len(gref) and gref[k] == gour[k]:
                k += 1
            rec["greedy_prefix_agree"] = f"{k}/{len(gref)}"
        rec["secs"] = round(time.time() - t0, 1)
        per_prompt.append(rec)
        if not quiet:
            print(json.dumps(rec), flush=True)
    a = np.concatenate(all_top8)
    summary = {"top8_absdiff": {"max": float(a.max()), "mean": float(a.mean()), "p50": _pct(a, 50),
                                "p90": _pct(a, 90), "p99": _pct(a, 99), "p999": _pct(a, 99.9), "n": int(a.size)},
               "top1_agreement": f"{top1_agree}/{top1_total}",
               "top1_agreement_frac": top1_agree / top1_total}
    if all_full:
        f = np.concatenate(all_full)
        summary["full_vocab_absdiff"] = {"max": float(f.max()), "mean": float(f.mean()), "p50": _pct(f, 50),
                                         "p99": _pct(f, 99), "n": int(f.size)}
    return summary, per_prompt


def write_fixture(m, fx, out, n_greedy=32):
    """Same schema as the llama.cpp fixture, logits from this numpy forward (same tokens)."""
    sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
    from make_parity_fixtures import topk, dump
    prompts = []
    for p in fx["prompts"]:
        toks = p["tokens"]
        m.reset()
        lg = m.forward(toks)
        tids, tvals = zip(*(topk(r) for r in lg))
        g, di, dv = [], [], []
        nxt = int(np.argmax(lg[-1]))
        for step in range(n_greedy):
            g.append(nxt)
            if step + 1 == n_greedy:
                break
            row = m.forward([nxt])[-1]
            i8, v8 = topk(row)
            di.append(i8)
            dv.append(v8)
            nxt = int(np.argmax(row))
        eos = fx["model"]["eos_id"]
        prompts.append({"name": p["name"], "text": p["text"], "n_tokens": len(toks), "tokens": toks,
                        "top_ids": list(tids), "top_logits": list(tvals),
                        "greedy": {"ids": g, "eos_at": g.index(eos) if eos in g else -1,
                                   "decode_top_ids": di, "decode_top_logits": dv}})
        print(f"{p['name']}: done", file=sys.stderr, flush=True)
    gen = {"engine": "scripts/numpy_reference_forward.py (numpy, all weights dequantized exactly to float32 "
                     "with the gguf package; fp32 activations, fp32 KV cache, no activation quantization)",
           "dtype": np.dtype(m.dtype).name, "emulate_llamacpp": m.emulate,
           "prompt_eval": "one forward over all prompt tokens; greedy steps one token at a time with a KV cache",
           "topk": 8, "greedy_steps": n_greedy, "greedy_stops_at_eos": False,
           "tokens_from": "the llama.cpp fixture (llm.tokenize(text, add_bos=False, special=True))"}
    obj = {"schema": fx["schema"], "description": fx["description"].replace("llama.cpp reference", "fp32 numpy reference"),
           "generation": gen, "model": fx["model"], "prompts": prompts}
    dump(obj, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--emulate-llamacpp", action="store_true",
                    help="mimic llama.cpp CPU numerics (q8_1/q8_0 activations, f16 K/V/Q/probs); default exact fp32")
    ap.add_argument("--text", help="tokenizes with llama_cpp (needed for text input)")
    ap.add_argument("--tokens", help="comma separated token ids")
    ap.add_argument("--fixture", help="parity fixture JSON to compare against")
    ap.add_argument("--llama", action="store_true", help="also run llama_cpp for full-vocab diffs")
    ap.add_argument("--out", help="write the comparison summary JSON here")
    ap.add_argument("--write-fixture", help="with --fixture: write a fixture of the same schema from this "
                                            "numpy forward (same tokens) to this path")
    a = ap.parse_args()
    t0 = time.time()
    m = LlamaNumpy(a.model, dtype=np.dtype(a.dtype).type, emulate=a.emulate_llamacpp)
    print(f"loaded in {time.time()-t0:.1f}s: layers={m.n_layer} embd={m.n_embd} heads={m.n_head}/{m.n_head_kv} "
          f"head_dim={m.head_dim} n_rot={m.n_rot} eps={m.eps} rope_base={m.rope_base} vocab={m.n_vocab} "
          f"arch={m.arch} rope={'neox' if m.rope_neox else 'normal'} "
          f"qkv_bias={'blk.0.attn_q.bias' in m.w} tied_output={'output.weight' not in m.w}",
          file=sys.stderr)
    if a.fixture:
        fx = json.load(open(a.fixture))
        if a.write_fixture:
            write_fixture(m, fx, a.write_fixture)
            return
        summary, per = compare_fixture(m, fx, a.llama, a.model)
        summary["dtype"] = a.dtype
        summary["emulate_llamacpp"] = a.emulate_llamacpp
        print(json.dumps(summary, indent=1))
        if a.out:
            json.dump({"summary": summary, "per_prompt": per}, open(a.out, "w"), indent=1)
        return
    if a.tokens:
        toks = [int(t) for t in a.tokens.split(",")]
    elif a.text:
        import llama_cpp
        llm = llama_cpp.Llama(model_path=a.model, vocab_only=True, verbose=False)
        toks = llm.tokenize(a.text.encode("utf-8"), add_bos=False, special=True)
    else:
        sys.exit("give --text, --tokens or --fixture")
    lg = m.forward(toks)[-1]
    top = np.argsort(-lg)[:5]
    print("tokens:", toks)
    print("top5 last position:", [(int(i), round(float(lg[i]), 5)) for i in top])


if __name__ == "__main__":
    main()
