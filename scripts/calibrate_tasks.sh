#!/usr/bin/env bash
# Full-cache accuracy of the default model per generated task and context length: the
# calibration table in the README. Each cell is `kvbench run --method full` over SAMPLES
# samples (seed 0) of 5 turns, multi-turn, default knobs; extra arguments (e.g.
# --knob key_length=8) pass through to every run.
#   scripts/calibrate_tasks.sh [--lengths "1024 2048"] [--tasks "retr_kv mix"] [--samples N] [kvbench run options]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lengths="512 1024 2048 4096 7680"  # 7680: the 8192-token window also holds 5 turns
tasks="retr_kv retr_prefix_suffix multihop_vt math_find mix"
samples=4
while [ $# -gt 0 ]; do
  case "$1" in
    --lengths) lengths="$2"; shift 2 ;;
    --tasks) tasks="$2"; shift 2 ;;
    --samples) samples="$2"; shift 2 ;;
    *) break ;;
  esac
done
printf '| task |'; for l in $lengths; do printf ' %s |' "$l"; done; printf '\n'
printf '|---|'; for _ in $lengths; do printf -- '---:|'; done; printf '\n'
for task in $tasks; do
  printf '| %s |' "$task"
  for length in $lengths; do
    # The summary row's "acc %" column (6th field) of the full cache.
    acc=$("$root/scripts/kvbench" run --task "$task" --method full --no-fidelity --summary-only \
            --samples "$samples" --context-tokens "$length" "$@" |
          awk -v t="$task" '$1 == t && $3 == "full" { print $5 }')
    printf ' %s |' "${acc:-?}"
  done
  printf '\n'
done
