#!/usr/bin/env bash
# Decode speed beside llama.cpp's llama-bench: tg 32 at depth N against kvbench's one-token
# decode after N tokens of context, fp32 and int8 decode activations (scripts/compare_prefill.sh
# does both phases; this is its decode).
#   scripts/compare_decode.sh [--models qwen2.5-0.5b,smollm2-135m] [--depths 0,512,2048]
#                             [--threads 2] [--reps 2]
exec "$(dirname "${BASH_SOURCE[0]}")/compare_prefill.sh" --phase decode "$@"
