#!/usr/bin/env bash
# kvbench's forward pass beside llama.cpp's, same GGUF, same machine, one run, 2 threads.
#   scripts/compare_speed.sh [VENV]   (VENV with llama-cpp-python: scripts/reference_venv.sh)
# kvbench: bench/bench_forward (Google Benchmark, OMP_NUM_THREADS=2, OpenBLAS 2 threads).
# llama.cpp: scripts/llamacpp_reference_speed.py --threads 2.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-${KVBENCH_REFERENCE_VENV:-$root/.venv-reference}}"
model="${KVBENCH_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
build="${KVBENCH_BUILD_DIR:-$root/build}"
echo "== kvbench (bench_forward, 2 threads) =="
OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 KVBENCH_MODEL="$model" "$build/bench/bench_forward" \
  --benchmark_repetitions=3 --benchmark_report_aggregates_only=true 2>&1 | grep -E "^BM_.*median"
echo "== llama.cpp (llama-cpp-python, 2 threads) =="
"$venv/bin/python" "$root/scripts/llamacpp_reference_speed.py" --model "$model" --threads 2 --reps 3
