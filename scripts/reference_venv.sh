#!/usr/bin/env bash
# Create a Python venv with llama.cpp (llama-cpp-python) + gguf + numpy, used only by the
# reference scripts (make_parity_fixtures.py, numpy_reference_forward.py,
# llamacpp_reference_speed.py). kvbench itself (C++17) never depends on Python.
#
#   scripts/reference_venv.sh [DIR]        # default DIR=.venv-reference, where compare_speed.sh looks
#   DIR/bin/python scripts/make_parity_fixtures.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf
#
# llama-cpp-python is built from source (CPU backend, ~20-40 min on 2 cores).
# CMAKE_ARGS may be overridden; the default builds for the host CPU without tests/examples.
set -euo pipefail
DIR="${1:-.venv-reference}"
python3 -m venv "$DIR"
"$DIR/bin/pip" install --upgrade pip >/dev/null
export CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
"$DIR/bin/pip" install "llama-cpp-python==0.3.36" gguf numpy
"$DIR/bin/python" -c "import llama_cpp, gguf, numpy; print('llama-cpp-python', llama_cpp.__version__); print(llama_cpp.llama_print_system_info().decode())"
