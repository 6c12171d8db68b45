#!/usr/bin/env bash
# Prefill (or decode) speed beside llama.cpp's own benchmark, one run, same GGUF, same threads:
# llama-bench (built from the llama.cpp that scripts/build_llama_server.sh vendors, flash
# attention off and on) and kvbench's bench_forward with fp32 and int8 activations. Prefill:
# pp N against BM_Prefill (--prefill-activations); decode (--phase decode, which
# scripts/compare_decode.sh passes): tg 32 at depth N against BM_Decode, one token at a time
# after N tokens of context (--decode-activations). Prints one table per model: tok/s and
# kvbench's ratio to llama.cpp's better setting, with this CPU and llama.cpp's system line
# (docs/speed.md names both).
#
#   scripts/compare_prefill.sh [--models qwen2.5-0.5b,smollm2-135m] [--lengths 512,2048]
#                              [--threads 2] [--reps 2] [--phase prefill|decode]
#   scripts/compare_decode.sh  [--models ...] [--depths 0,512,2048] [--threads 2] [--reps 2]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models="qwen2.5-0.5b,smollm2-135m"
phase=prefill
lengths=""  # token counts: the prompt's (prefill) or the context's before the token (decode)
threads=2
reps=2
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --lengths|--depths) lengths="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --phase) phase="$2"; shift 2 ;;
    *) echo "compare_$phase.sh: unknown argument '$1' (see the comment at the top)" >&2; exit 2 ;;
  esac
done
case "$phase" in
  prefill) lengths="${lengths:-512,2048}"
           llama_args=(-p "$lengths" -n 0)
           contexts="$lengths"  # bench_forward's prefill cases at exactly these lengths
           filter="^BM_Prefill(Int8)?/(${lengths//,/|})/iterations:1/" ;;
  decode) lengths="${lengths:-0,512,2048}"
          llama_args=(-p 0 -n 32 -d "$lengths")
          # bench_forward decodes at 0, 2048 and 4096 by default; other depths are added.
          contexts=""
          for d in ${lengths//,/ }; do
            case "$d" in 0|2048|4096) ;; *) contexts="${contexts:+$contexts,}$d" ;; esac
          done
          filter="^BM_Decode(Int8)?/(${lengths//,/|})/iterations" ;;
  *) echo "compare_prefill.sh: --phase prefill or decode, not '$phase'" >&2; exit 2 ;;
esac
build="${KVBENCH_BUILD_DIR:-$root/build}"
"$root/scripts/build_llama_server.sh" >/dev/null
llama_bench="$root/.llama-server/build/bin/llama-bench"
[ -x "$llama_bench" ] || cmake --build "$root/.llama-server/build" --target llama-bench -j "$(nproc)" >&2
[ -x "$build/bench/bench_forward" ] || cmake --build "$build" --target bench_forward >&2
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores;" \
  "VNNI: $(grep -qw avx512_vnni /proc/cpuinfo && echo yes || echo no)"

for name in ${models//,/ }; do
  case "$name" in
    smollm2-135m) gguf="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
    qwen2.5-0.5b) gguf="$root/models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf" ;;
    qwen2.5-1.5b) gguf="$root/models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf" ;;
    *) gguf="$name" ;;
  esac
  [ "$gguf" = "$name" ] || "$root/scripts/fetch_model.sh" "$name" >/dev/null
  "$llama_bench" -m "$gguf" -t "$threads" "${llama_args[@]}" -fa off,on -r "$reps" -o json \
    > "$out/llama.json" 2> "$out/llama.err"
  KVBENCH_BENCH_CONTEXTS="$contexts" KVBENCH_MODEL="$gguf" OMP_NUM_THREADS="$threads" \
    "$build/bench/bench_forward" --benchmark_filter="$filter" \
    --benchmark_repetitions="$reps" --benchmark_out="$out/kvbench.json" \
    --benchmark_out_format=json > /dev/null 2>&1
  python3 - "$name" "$phase" "$out/kvbench.json" "$out/llama.json" <<'PY'
import json, statistics, sys
name, phase, ours_file, theirs_file = sys.argv[1:]
ours = {}
for b in json.load(open(ours_file))["benchmarks"]:
    if b.get("run_type") == "aggregate" or "tok/s" not in b:
        continue
    kind, n = b["name"].split("/")[:2]
    ours.setdefault((int(n), "int8" if kind.endswith("Int8") else "fp32"), []).append(b["tok/s"])
theirs = {}
rows = json.load(open(theirs_file))
for r in rows:
    n = r["n_prompt"] if phase == "prefill" else r.get("n_depth", 0)
    key = (n, "on" if r.get("flash_attn") else "off")
    theirs[key] = max(theirs.get(key, 0), r["avg_ts"])
what = "prefill tok/s" if phase == "prefill" else "decode tok/s at depth N"
print(f"\n{name}: {what} (median of the runs; llama.cpp: best of its runs)")
print(f"llama.cpp: {rows[0].get('build_commit', '?')}, {rows[0].get('cpu_info', '?')}, "
      f"backends {rows[0].get('backends', '?')}")
print(f"| {'tokens' if phase == 'prefill' else 'depth'} | kvbench fp32 | kvbench int8 | "
      "llama.cpp flash off | flash on | ratio fp32 | ratio int8 |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for n in sorted({k[0] for k in ours}):
    fp32, int8 = ours.get((n, "fp32")), ours.get((n, "int8"))
    off, on = theirs.get((n, "off"), 0), theirs.get((n, "on"), 0)
    best = max(off, on) or float("nan")
    med = lambda v: statistics.median(v) if v else 0
    print(f"| {n} | {med(fp32):.1f} | {med(int8):.1f} | {off:.1f} | {on:.1f} | "
          f"{med(fp32) / best:.2f}x | {med(int8) / best:.2f}x |")
PY
done
