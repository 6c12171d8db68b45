#!/usr/bin/env bash
# Builds llama.cpp's own server (llama-server: continuous batching over -np slots) from the
# llama.cpp sources vendored in llama-cpp-python 0.3.36's sdist on PyPI (the same llama.cpp
# scripts/reference_venv.sh builds for the parity and speed references), for
# scripts/compare_serving.sh. CPU backend, built for this machine; nothing of it is
# committed or linked into kvbench.
#
#   scripts/build_llama_server.sh [DIR]   # default DIR=.llama-server; prints the binary's path
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="${1:-$root/.llama-server}"
binary="$dir/build/bin/llama-server"
if [ -x "$binary" ]; then echo "$binary"; exit 0; fi
mkdir -p "$dir"
if [ ! -d "$dir/src" ]; then
  tmp="$(mktemp -d)"
  python3 -m pip download --quiet --no-deps --no-binary :all: --disable-pip-version-check \
    llama-cpp-python==0.3.36 -d "$tmp" >&2
  tar -xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp"
  mv "$tmp/llama_cpp_python-0.3.36/vendor/llama.cpp" "$dir/src"
  rm -rf "$tmp"
fi
cmake -S "$dir/src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_TOOLS=ON >&2
cmake --build "$dir/build" --target llama-server -j "$(nproc)" >&2
echo "$binary"
