#!/usr/bin/env python3
"""Reference CPU speed of llama.cpp (via llama-cpp-python) for kvbench comparisons.

  scripts/llamacpp_reference_speed.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf --threads 2

Measures (median of --reps repetitions, wall clock around llm.eval):
  * prefill tokens/s: one llm.eval(N tokens) into an empty KV cache, N in {512, 2048},
    with n_batch = n_ubatch = 512 (four ubatches for N=2048) and n_batch = n_ubatch = 2048;
  * decode tokens/s at context K in {0, 2048, 4096}: after prefilling K tokens
    (n_batch 512, once), 64 single-token llm.eval([t]) calls are timed; each
    repetition rewinds the cache to K tokens first.
Settings: flash_attn off, KV cache f16, logits only for the last token of each
eval (logits_all=False), n_ctx = 4096 + 64 + slack.  Timings include the small
Python/ctypes overhead of llama-cpp-python's eval (no sampling).
--perf prints llama.cpp's own llama_perf_context_print for one prefill + decode case.
"""
import argparse
import json
import platform
import statistics
import sys
import time

PREFILL_N = (512, 2048)
PREFILL_BATCH = (512, 2048)
DECODE_CTX = (0, 2048, 4096)
DECODE_STEPS = 64


def make_tokens(n, n_vocab):
    # deterministic ordinary-token ids (ids < 100 include special/control tokens; avoid them)
    return [100 + (i * 7919) % (min(n_vocab, 49152) - 200) for i in range(n)]


def new_llm(llama_cpp, model, threads, n_batch, n_ctx, verbose=False):
    return llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                           n_threads=threads, n_threads_batch=threads, logits_all=False,
                           flash_attn=False, seed=0, verbose=verbose)


def ev(llama_cpp, llm, toks):
    llm.eval(toks)
    # llama.cpp accumulates its perf counters in llama_synchronize(); llama-cpp-python only calls it
    # when logits are read, so call it explicitly (cheap; the CPU backend computes synchronously)
    llama_cpp.llama_synchronize(llm.ctx)


class QuietStderr:
    """Silence C-level stderr (llama.cpp's verbose model-load log) inside a with-block."""
    def __enter__(self):
        import os
        sys.stderr.flush()
        self.saved = os.dup(2)
        dn = os.open(os.devnull, os.O_WRONLY)
        os.dup2(dn, 2)
        os.close(dn)

    def __exit__(self, *exc):
        import os
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="also write the results as JSON here")
    ap.add_argument("--only", default="all", choices=["all", "prefill", "decode"])
    ap.add_argument("--perf", action="store_true", help="print llama_perf_context_print for one case")
    a = ap.parse_args()

    import llama_cpp
    n_ctx = max(DECODE_CTX) + DECODE_STEPS + 64
    rows = []

    def rec(kind, n, nb, times, ntok):
        tps = [ntok / t for t in times]
        r = {"kind": kind, "tokens_or_ctx": n, "n_batch": nb, "tok_per_s_median": statistics.median(tps),
             "tok_per_s_all": [round(x, 1) for x in tps], "secs_all": [round(t, 4) for t in times]}
        rows.append(r)
        print(f"  {kind:8s} N/ctx={n:5d} n_batch={nb:5d}: median {r['tok_per_s_median']:8.1f} tok/s  "
              f"(runs {', '.join(f'{x:.1f}' for x in tps)})", file=sys.stderr, flush=True)

    for nb in (PREFILL_BATCH if a.only in ("all", "prefill") else ()):
        llm = new_llm(llama_cpp, a.model, a.threads, nb, n_ctx)
        toks = make_tokens(max(PREFILL_N), llm.n_vocab())
        llm.reset(); ev(llama_cpp, llm, toks[:64])  # warm-up
        for n in PREFILL_N:
            ts = []
            for _ in range(a.reps):
                llm.reset()
                t0 = time.perf_counter(); ev(llama_cpp, llm, toks[:n]); ts.append(time.perf_counter() - t0)
            rec("prefill", n, nb, ts, n)
        if nb != 512:
            del llm

    llm = new_llm(llama_cpp, a.model, a.threads, 512, n_ctx)
    toks = make_tokens(max(DECODE_CTX) + DECODE_STEPS, llm.n_vocab())
    for k in (DECODE_CTX if a.only in ("all", "decode") else ()):
        ts = []
        llm.reset()
        if k:
            ev(llama_cpp, llm, toks[:k])  # prefill once; each rep rewinds to k (eval() drops cache cells >= n_tokens)
        for _ in range(a.reps):
            llm.n_tokens = k
            t0 = time.perf_counter()
            for j in range(DECODE_STEPS):
                ev(llama_cpp, llm, [toks[k + j]])
            ts.append(time.perf_counter() - t0)
        rec("decode", k, 1, ts, DECODE_STEPS)
    del llm

    print()
    print(f"llama.cpp (llama-cpp-python {llama_cpp.__version__}) CPU, n_threads={a.threads}, "
          f"flash_attn=off, KV f16, {a.reps} reps, median")
    print(f"{'case':34s} {'tok/s':>9s}")
    for r in rows:
        if r["kind"] == "prefill":
            name = f"prefill {r['tokens_or_ctx']} tok, n_batch={r['n_batch']}"
        else:
            name = f"decode @ ctx {r['tokens_or_ctx']} ({DECODE_STEPS} steps)"
        print(f"{name:34s} {r['tok_per_s_median']:9.1f}")

    if a.perf:
        # llama.cpp's own timers for one case: prefill 512 (n_batch 512) then 64 decode steps
        with QuietStderr():
            llm = new_llm(llama_cpp, a.model, a.threads, 512, n_ctx, verbose=True)
        toks = make_tokens(512 + DECODE_STEPS, llm.n_vocab())
        llm.reset(); ev(llama_cpp, llm, toks[:64])
        llm.reset()
        llama_cpp.llama_perf_context_reset(llm.ctx)
        t0 = time.perf_counter(); ev(llama_cpp, llm, toks[:512]); tp = time.perf_counter() - t0
        t0 = time.perf_counter()
        for j in range(DECODE_STEPS):
            ev(llama_cpp, llm, [toks[512 + j]])
        td = time.perf_counter() - t0
        sys.stdout.flush()
        llama_cpp.llama_perf_context_print(llm.ctx)
        d = llama_cpp.llama_perf_context(llm.ctx)
        print(f"\nperf case: prefill 512 (n_batch 512) + {DECODE_STEPS} decode steps at ctx 512..575")
        print(f"  python wall: prefill {512/tp:.1f} tok/s, decode {DECODE_STEPS/td:.1f} tok/s")
        with QuietStderr():
            del llm
        print(f"  llama_perf_context: t_p_eval_ms={d.t_p_eval_ms:.2f} n_p_eval={d.n_p_eval} "
              f"({1e3*d.n_p_eval/max(d.t_p_eval_ms,1e-9):.1f} tok/s), t_eval_ms={d.t_eval_ms:.2f} n_eval={d.n_eval} "
              f"({1e3*d.n_eval/max(d.t_eval_ms,1e-9):.1f} tok/s)")

    if a.json:
        json.dump({"llama_cpp_python_version": llama_cpp.__version__, "threads": a.threads, "reps": a.reps,
                   "machine": platform.machine(), "system_info": llama_cpp.llama_print_system_info().decode(),
                   "rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
