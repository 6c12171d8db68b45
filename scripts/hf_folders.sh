#!/usr/bin/env bash
# hf_folders.sh [NAME...]: Hugging Face folders of kvbench's GGUF models, exported by
# transformers itself (scripts/export_hf_folder.py: bf16 safetensors, tokenizer.json, the chat
# template), each with transformers' own fp32 forward over the folder beside it
# (transformers_parity.json), which tests/test_hf_folder_model.cpp holds kvbench to.
# NAME: smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b (default: all three). Into
# ~/.cache/kvbench/hf/NAME ($KVBENCH_HF_DIR/NAME); a folder whose parity file is there is
# left alone. transformers, torch and gguf come from PyPI into .venv-hf (about 6 GB: PyPI's
# torch brings its CUDA libraries), pinned to the versions the fixtures were first made with.
# CI runs it (docs/ci.md): about 2 minutes for the venv, then 1-3 minutes a model.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || set -- smollm2-135m qwen2.5-0.5b qwen2.5-1.5b
parent="${KVBENCH_HF_DIR:-$HOME/.cache/kvbench/hf}"
venv="${KVBENCH_HF_VENV:-.venv-hf}"

if ! "$venv/bin/python" -c "import transformers, torch, gguf, accelerate" 2>/dev/null; then
  echo "hf_folders: creating $venv (torch, transformers, gguf from PyPI)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "torch==2.15.0" "transformers==5.2.0" "gguf==0.19.0" "accelerate==1.16.0" "safetensors==0.8.0"
fi

for name in "$@"; do
  case "$name" in
    smollm2-135m) gguf=SmolLM2-135M-Instruct.Q4_1.gguf ;;
    qwen2.5-0.5b) gguf=Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf ;;
    qwen2.5-1.5b) gguf=Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf ;;
    *) echo "hf_folders: unknown model '$name' (smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b)" >&2; exit 2 ;;
  esac
  out="$parent/$name"
  [ -f "$out/transformers_parity.json" ] && continue
  scripts/fetch_model.sh "$name"
  echo "hf_folders: exporting $name into $out" >&2
  rm -rf "$out"
  # The parity file is written last: a folder without it is an export that did not finish.
  HF_HUB_OFFLINE=1 TQDM_DISABLE=1 "$venv/bin/python" scripts/export_hf_folder.py \
    --gguf "models/$gguf" --out "$out" --fixture "$out/transformers_parity.json.part" >/dev/null
  mv "$out/transformers_parity.json.part" "$out/transformers_parity.json"
done
