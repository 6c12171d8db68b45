#!/usr/bin/env python3
"""Reference CPU speed of llama.cpp (via llama-cpp-python) for kvbench comparisons.

  scripts/llamacpp_reference_speed.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2 \
      --prefill 512,2048 --decode 0,2048 --flash both

Measures (median of --reps repetitions, wall clock around llm.eval):
  * prefill tokens/s: one llm.eval(N tokens) into an empty KV cache, for each N in --prefill and
    each n_batch = n_ubatch in --n-batch;
  * decode tokens/s at context K for each K in --decode: after prefilling K tokens (once), 32
    single-token llm.eval([t]) calls are timed; each repetition rewinds the cache to K tokens.
Each with flash attention off, on, or both (--flash). KV cache f16, logits only for the last
token of each eval, n_ctx = the longest case + slack. Timings include the small Python/ctypes
overhead of llama-cpp-python's eval (no sampling).
Prints one line per case ("llama.cpp prefill N flash=off n_batch=B tok/s=X"), the lines
scripts/compare_speed.sh reads, and --json writes them too.
"""
import argparse
import json
import platform
import statistics
import sys
import time

DECODE_STEPS = 32


def make_tokens(n, n_vocab):
    # deterministic ordinary-token ids (ids < 100 include special/control tokens; avoid them)
    return [100 + (i * 7919) % (min(n_vocab, 49152) - 200) for i in range(n)]


def lengths(text):
    return [int(x) for x in text.split(",") if x != ""]


def new_llm(llama_cpp, model, threads, n_batch, n_ctx, flash):
    return llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                           n_threads=threads, n_threads_batch=threads, logits_all=False,
                           flash_attn=flash, seed=0, verbose=False)


def ev(llama_cpp, llm, toks):
    llm.eval(toks)
    # llama.cpp accumulates its perf counters in llama_synchronize(); llama-cpp-python only calls it
    # when logits are read, so call it explicitly (cheap; the CPU backend computes synchronously)
    llama_cpp.llama_synchronize(llm.ctx)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prefill", type=lengths, default=[512, 2048], help="prompt lengths, comma-separated")
    ap.add_argument("--decode", type=lengths, default=[0, 2048, 4096], help="decode depths, comma-separated")
    ap.add_argument("--n-batch", type=lengths, default=[512], help="prefill n_batch values, comma-separated")
    ap.add_argument("--flash", choices=["off", "on", "both"], default="both")
    ap.add_argument("--json", help="also write the results as JSON here")
    a = ap.parse_args()

    import llama_cpp
    n_ctx = max(a.prefill + [d + DECODE_STEPS for d in a.decode]) + 64
    rows = []

    def rec(kind, n, flash, nb, times, ntok):
        tps = [ntok / t for t in times]
        r = {"kind": kind, "n": n, "flash": flash, "n_batch": nb,
             "tok_per_s": statistics.median(tps), "tok_per_s_all": [round(x, 2) for x in tps]}
        rows.append(r)
        print(f"llama.cpp {kind} {n} flash={'on' if flash else 'off'} n_batch={nb} "
              f"tok/s={r['tok_per_s']:.2f} (runs {', '.join(f'{x:.1f}' for x in tps)})", flush=True)

    for flash in {"off": [False], "on": [True], "both": [False, True]}[a.flash]:
        for nb in a.n_batch:
            if not a.prefill:
                break
            llm = new_llm(llama_cpp, a.model, a.threads, nb, n_ctx, flash)
            toks = make_tokens(max(a.prefill), llm.n_vocab())
            llm.reset(); ev(llama_cpp, llm, toks[:64])  # warm-up
            for n in a.prefill:
                ts = []
                for _ in range(a.reps):
                    llm.reset()
                    t0 = time.perf_counter(); ev(llama_cpp, llm, toks[:n]); ts.append(time.perf_counter() - t0)
                rec("prefill", n, flash, nb, ts, n)
            del llm
        if not a.decode:
            continue
        llm = new_llm(llama_cpp, a.model, a.threads, 512, n_ctx, flash)
        toks = make_tokens(max(a.decode) + DECODE_STEPS, llm.n_vocab())
        llm.reset(); ev(llama_cpp, llm, toks[:16])  # warm-up
        for k in sorted(a.decode):
            ts = []
            llm.reset()
            if k:
                ev(llama_cpp, llm, toks[:k])  # prefill once; each rep rewinds to k
            for _ in range(a.reps):
                llm.n_tokens = k
                t0 = time.perf_counter()
                for j in range(DECODE_STEPS):
                    ev(llama_cpp, llm, [toks[k + j]])
                ts.append(time.perf_counter() - t0)
            rec("decode", k, flash, 1, ts, DECODE_STEPS)
        del llm

    if a.json:
        json.dump({"llama_cpp_python_version": llama_cpp.__version__, "threads": a.threads, "reps": a.reps,
                   "machine": platform.machine(), "system_info": llama_cpp.llama_print_system_info().decode(),
                   "rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
