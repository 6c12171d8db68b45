#!/usr/bin/env bash
# Compiles every CUDA source with nvcc for sm_80 and sm_90. The kernels are framework-free,
# so this needs only the CUDA toolkit, not a GPU nor a CUDA libtorch.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
if [ ! -x "$nvcc" ]; then echo "compile_cuda: nvcc not found" >&2; exit 1; fi
out="$(mktemp -d)"; trap 'rm -rf "$out"' EXIT
n=0
for src in "$root"/kernels/cuda/*.cu; do
  "$nvcc" -std=c++17 -O2 -I"$root" \
    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -c "$src" -o "$out/$(basename "$src").o"
  n=$((n + 1))
done
echo "compile_cuda: $n CUDA sources compiled for sm_80 and sm_90"
