#!/usr/bin/env bash
# A standard load generator against `kvbench serve`, to show that it reads it as it reads any
# OpenAI server: guidellm 0.8.1 (PyPI, in a scratch venv .venv-loadgen, with the openai
# client) sends synthetic prompts of fixed lengths at several concurrency levels. guidellm
# counts tokens with a Hugging Face tokenizer, which this machine cannot download: it is
# written from the GGUF's own vocabulary by transformers (offline).
#
#   scripts/guidellm_serve.sh [OUT]   # default OUT=kvbench-out/guidellm
#
# Environment: MODEL (smollm2-135m), METHOD (full), THREADS (2), PROMPT (256), OUTPUT (64),
# STREAMS ("1,2,4,8"), REQUESTS (16 per level).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/kvbench-out/guidellm}"
model="${MODEL:-smollm2-135m}"
port=18190
venv="$root/.venv-loadgen"
kvbench="$root/build/kvbench"
"$root/scripts/setup.sh" >/dev/null
if [ ! -x "$venv/bin/guidellm" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet "guidellm==0.8.1" openai gguf
fi
gguf="$("$kvbench" list models 2>/dev/null | awk -v m="$model" '$1 == m {print $NF}')"
[ -f "$gguf" ] || { echo "guidellm_serve: no GGUF for $model (kvbench list models)" >&2; exit 2; }
mkdir -p "$out"
tokenizer="$out/hf-tokenizer-$model"
if [ ! -f "$tokenizer/tokenizer.json" ]; then
  HF_HUB_OFFLINE=1 "$venv/bin/python" - "$gguf" "$tokenizer" <<'PY'
import os, sys
from transformers import AutoTokenizer
gguf, out = sys.argv[1], sys.argv[2]
AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf)).save_pretrained(out)
PY
fi
"$kvbench" --model "$gguf" --threads "${THREADS:-2}" serve --port "$port" \
  --method "${METHOD:-full}" --max-seqs 16 --served-model-name "$model" > "$out/kvbench-serve.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
cd "$out"
HF_HUB_OFFLINE=1 "$venv/bin/guidellm" run \
  --backend "kind=openai_http,target=http://127.0.0.1:$port,model=$model" \
  --profile "kind=concurrent,streams=${STREAMS:-1,2,4,8}" \
  --data "kind=synthetic_text,prompt_tokens=${PROMPT:-256},output_tokens=${OUTPUT:-64}" \
  --tokenizer "kind=huggingface_auto,model=$tokenizer" \
  --constraint "kind=max_requests,count=${REQUESTS:-16}" \
  --output "kind=json,path=$out/guidellm.json" --output "kind=console" \
  --disable-console-interactive
curl -s "http://127.0.0.1:$port/metrics" > "$out/metrics.txt"
