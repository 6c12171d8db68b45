#!/usr/bin/env bash
# kvbench's forward pass beside llama.cpp's: same GGUF, same machine, same thread count, one
# run. For each model, prefill of N tokens and one-token decode at depth 0 and N, for each N.
#
#   scripts/compare_speed.sh [--models smollm2-135m,qwen2.5-0.5b,qwen2.5-1.5b]
#                            [--lengths 512,2048,4096,8192,16384]
#                            [--threads 2] [--reps 1] [--out DIR]
#
# kvbench: bench/bench_forward (fp32 activations, and int8: --prefill-activations and
# --decode-activations).
# Its OpenMP threads wait as the environment says: unset, libgomp spins a while and then
# sleeps, as llama.cpp's own thread pool spins; scripts/kvbench sets OMP_WAIT_POLICY=PASSIVE
# for shared machines, which costs a quiet machine a third of its decode speed (docs/speed.md).
# llama.cpp: scripts/llamacpp_reference_speed.py in $KVBENCH_REFERENCE_VENV (default
# .venv-reference; make it with scripts/reference_venv.sh), flash attention off and on.
# Prints a table per model: each case's tok/s, and kvbench's ratio to the better llama.cpp
# setting. The raw results stay in --out (default a temporary directory).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models="smollm2-135m,qwen2.5-0.5b,qwen2.5-1.5b"
lengths="512,2048,4096,8192,16384"
threads=2
reps=1
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models="$2"; shift 2 ;;
    --lengths) lengths="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "compare_speed.sh: unknown argument '$1' (see the comment at the top)" >&2; exit 2 ;;
  esac
done
venv="${KVBENCH_REFERENCE_VENV:-$root/.venv-reference}"
build="${KVBENCH_BUILD_DIR:-$root/build}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import llama_cpp" 2>/dev/null; then
  echo "compare_speed.sh: no llama-cpp-python in $venv (scripts/reference_venv.sh $venv)" >&2
  exit 2
fi
[ -x "$build/bench/bench_forward" ] || cmake --build "$build" --target bench_forward >&2
out="${out:-$(mktemp -d)}"
mkdir -p "$out"

model_file() {
  case "$1" in
    smollm2-135m) echo "$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" ;;
    qwen2.5-0.5b) echo "$root/models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf" ;;
    qwen2.5-1.5b) echo "$root/models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf" ;;
    *) echo "$1" ;;
  esac
}

for name in ${models//,/ }; do
  gguf="$(model_file "$name")"
  # A short name (model_file mapped it) is fetched and checked if missing; a path is as given.
  [ "$gguf" = "$name" ] || "$root/scripts/fetch_model.sh" "$name"
  [ -f "$gguf" ] || { echo "compare_speed.sh: no model file $gguf (scripts/setup.sh)" >&2; exit 2; }
  tag="$(basename "$gguf" .gguf)"
  echo "== $name: kvbench (bench_forward, $threads threads, OMP_WAIT_POLICY='${OMP_WAIT_POLICY:-}') ==" >&2
  KVBENCH_BENCH_CONTEXTS="$lengths" KVBENCH_MODEL="$gguf" OMP_NUM_THREADS="$threads" \
    "$build/bench/bench_forward" \
    --benchmark_filter='^BM_Prefill(Int8)?/[0-9]+/iterations:1/|^BM_Decode(Int8)?/([0-9]+/iterations:4|0/iterations:8)/' \
    --benchmark_repetitions="$reps" --benchmark_out="$out/kvbench-$tag.json" \
    --benchmark_out_format=json >&2
  echo "== $name: llama.cpp (llama-cpp-python, $threads threads) ==" >&2
  "$venv/bin/python" "$root/scripts/llamacpp_reference_speed.py" --model "$gguf" \
    --threads "$threads" --reps "$reps" --prefill "$lengths" --decode "0,$lengths" --flash both \
    --json "$out/llamacpp-$tag.json" >&2
  python3 - "$name" "$out/kvbench-$tag.json" "$out/llamacpp-$tag.json" <<'EOF'
import json, statistics, sys
name, ours_file, theirs_file = sys.argv[1:]
ours = {}
for b in json.load(open(ours_file))["benchmarks"]:
    if b.get("run_type") == "aggregate" or "tok/s" not in b:
        continue
    parts = b["name"].split("/")
    kind = {"BM_Prefill": ("prefill", "fp32"), "BM_PrefillInt8": ("prefill", "int8"),
            "BM_Decode": ("decode", "fp32"),
            "BM_DecodeInt8": ("decode", "int8")}[parts[0]]
    ours.setdefault((kind[0], int(parts[1]), kind[1]), []).append(b["tok/s"])
theirs = {}
for r in json.load(open(theirs_file))["rows"]:
    key = (r["kind"], r["n"], "on" if r["flash"] else "off")
    theirs[key] = max(theirs.get(key, 0), r["tok_per_s"])
print(f"\n{name}: tok/s (median of the runs); ratio = kvbench / the better llama.cpp setting")
print("| case | kvbench fp32 | kvbench int8 | llama.cpp flash off | flash on | ratio fp32 | ratio int8 |")
print("|---|---:|---:|---:|---:|---:|---:|")
cases = sorted({(k[0], k[1]) for k in ours}, key=lambda c: (c[0] != "prefill", c[1]))
for kind, n in cases:
    fp32 = ours.get((kind, n, "fp32"))
    int8 = ours.get((kind, n, "int8"))
    off, on = theirs.get((kind, n, "off")), theirs.get((kind, n, "on"))
    best = max([x for x in (off, on) if x] or [0])
    cell = lambda v: f"{statistics.median(v):.1f}" if v else "-"
    ratio = lambda v: f"{statistics.median(v) / best:.2f}x" if v and best else "-"
    print(f"| {kind} {'at ' if kind == 'decode' else ''}{n} | {cell(fp32)} | {cell(int8)} | "
          f"{off or 0:.1f} | {on or 0:.1f} | {ratio(fp32)} | {ratio(int8)} |")
EOF
done
