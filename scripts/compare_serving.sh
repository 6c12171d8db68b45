#!/usr/bin/env bash
# Serving under load, side by side in one run (docs/serving.md): llama.cpp's own server
# (llama-server, continuous batching over -np slots with its prompt cache, built by
# scripts/build_llama_server.sh) and `kvbench serve` with several cache methods, one after the
# other on the same GGUF, the same thread count and the same load: `kvbench load` sends
# kvbench's shared-context sessions (each user a sample: its context and first question, then
# the next question with the gold answer before it) at each concurrency level, scores the
# answers and times them, all into one results db; then `kvbench report` renders it.
# Then the pool experiment: a KV pool that holds four full fp32 caches of a 4K-token request,
# the full cache against KIVI 4 bits: the most sequences held at once and their throughput.
#
#   scripts/compare_serving.sh [OUT]      # default OUT=kvbench-out/serving
#
# Environment: MODEL (qwen2.5-0.5b), THREADS (2), TASK (retr_kv), CONTEXT (512), USERS (16),
# TURNS (2), LEVELS ("1 2 4 8 16"), METHODS (the kvbench methods), POOL_MIB (384), POOL_CONTEXT
# (3072), POOL_MAX_NEW (1024: prompt and answer fill the 4096 tokens a full cache of the pool
# holds), POOL_IGNORE_EOS (1: every answer runs to POOL_MAX_NEW, so answers outlast the next
# prompts' prefills and the pool, not the prefill queue, bounds how many run; 0: answers end
# where the model ends them), POOL_USERS (16), POOL_MODEL (MODEL), POOL_FLAGS (kvbench model
# flags for the pool runs, e.g. "--prefill-activations int8": the bytes held do not depend on
# them), SKIP_POOL=1 to leave the pool experiment out,
# LLAMA_RUNS ("cache-prompt no-cache-prompt"; " " for none). A method written METHOD@int8
# runs with --prefill-activations int8 --decode-activations int8 (llama.cpp's rounding).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/kvbench-out/serving}"
model="${MODEL:-qwen2.5-0.5b}"
threads="${THREADS:-2}"
task="${TASK:-retr_kv}"
context="${CONTEXT:-512}"
users="${USERS:-16}"
turns="${TURNS:-2}"
read -r -a levels <<< "${LEVELS:-1 2 4 8 16}"
read -r -a methods <<< "${METHODS:-full full@int8 bf16 kivi:bits=4 snapkv:ratio=0.25 prefix:block=64+tiers:device=64MB,cpu=512MB prefix:block=64+tiers:device=64MB,cpu=512MB@int8}"
port=18180  # one more for each server: a port just closed may not be bound again at once
kvbench="${KVBENCH_BUILD_DIR:-$root/build}/kvbench"  # KVBENCH_BUILD_DIR: another build of kvbench
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

"$root/scripts/setup.sh" >/dev/null
llama_server="$("$root/scripts/build_llama_server.sh")"
gguf="$("$kvbench" list models 2>/dev/null | awk -v m="$model" '$1 == m {print $NF}')"
[ -f "$gguf" ] || gguf="$root/models/$(ls "$root/models" | grep -i "${model%%-*}" | head -1)"
[ -f "$gguf" ] || { echo "compare_serving: no GGUF for $model" >&2; exit 2; }
mkdir -p "$out"
db="$out/serving.db"
# RESUME=1 keeps the db and runs only what it does not hold yet (a label per server/method).
[ "${RESUME:-0}" = 1 ] || rm -f "$db" "$db-wal" "$db-shm"
has_label() {
  [ -f "$db" ] && [ "$(sqlite3 "$db" "SELECT count(*) FROM serving WHERE label = '$1'" 2>/dev/null)" -gt 0 ]
}
max_levels="${levels[${#levels[@]}-1]}"

server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT
wait_ready() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && return 0
    kill -0 "$server_pid" 2>/dev/null || { echo "compare_serving: the server died" >&2; exit 1; }
    sleep 0.5
  done
  echo "compare_serving: the server did not come up" >&2
  exit 1
}
load() {  # load LABEL [METHOD] [extra load args...]
  local label="$1"; shift
  "$kvbench" --model "$gguf" load --endpoint "http://127.0.0.1:$port" --label "$label" \
    --task "$task" --context-tokens "$context" --users "$users" --turns "$turns" \
    --concurrency "${levels[@]}" --db "$db" "$@"
}

# llama.cpp's server: -np slots of the context each, fp16 KV, its prompt cache on.
slot_ctx=$(( (context + 512) * turns ))
# Twice: as it is deployed (its prompt cache on: a slot keeps a conversation's KV, the match
# for kvbench's prefix reuse), and without it (every request prefilled whole, the match for
# kvbench's caches without reuse).
for cache in ${LLAMA_RUNS:-cache-prompt no-cache-prompt}; do
  label="llama-server -np $max_levels (fp16 KV$([ $cache = cache-prompt ] || echo ', no prompt cache'))"
  has_label "$label" && continue
  port=$((port + 1))
  "$llama_server" -m "$gguf" -t "$threads" -tb "$threads" -np "$max_levels" \
    -c $(( slot_ctx * max_levels )) --host 127.0.0.1 --port "$port" --alias "$model" \
    "--$cache" > "$out/llama-server-$cache.log" 2>&1 &
  server_pid=$!
  wait_ready
  load "$label"
  stop_server
done

for entry in "${methods[@]}"; do
  method="${entry%@int8}"
  numerics=()
  label="kvbench serve $method"
  if [ "$method" != "$entry" ]; then
    numerics=(--prefill-activations int8 --decode-activations int8)
    label="$label (int8 activations)"
  fi
  has_label "$label" && continue
  port=$((port + 1))
  "$kvbench" --model "$gguf" --threads "$threads" "${numerics[@]}" serve --port "$port" \
    --method "$method" --max-seqs "$max_levels" --kv-pool-mib 2048 > "$out/kvbench-serve.log" 2>&1 &
  server_pid=$!
  wait_ready
  load "$label"
  curl -s "http://127.0.0.1:$port/metrics" > "$out/metrics-${entry//[^a-z0-9]/_}.txt"
  stop_server
done

if [ "${SKIP_POOL:-0}" != 1 ]; then
  # POOL_MIB: four full fp32 caches of 4096 tokens; for Qwen2.5-0.5B (24 layers, 2 KV heads of
  # 64) a token is 24 KiB, so 4 x 4096 x 24 KiB = 384 MiB. The requests: a context of
  # POOL_CONTEXT tokens, its question and an answer of up to POOL_MAX_NEW tokens within 4096.
  pool_load=(--max-new "${POOL_MAX_NEW:-1024}")
  [ "${POOL_IGNORE_EOS:-1}" = 1 ] && pool_load+=(--ignore-eos)
  pool_mib="${POOL_MIB:-384}"
  pool_gguf="$gguf"
  if [ -n "${POOL_MODEL:-}" ]; then
    pool_gguf="$("$kvbench" list models 2>/dev/null | awk -v m="$POOL_MODEL" '$1 == m {print $NF}')"
  fi
  for method in full kivi:bits=4; do
    has_label "pool $pool_mib MiB: kvbench serve $method" && continue
    port=$((port + 1))
    read -r -a pool_flags <<< "${POOL_FLAGS:-}"
    "$kvbench" --model "$pool_gguf" --threads "$threads" "${pool_flags[@]}" serve --port "$port" \
      --method "$method" --max-seqs 64 --kv-pool-mib "$pool_mib" > "$out/kvbench-serve-pool.log" 2>&1 &
    server_pid=$!
    wait_ready
    "$kvbench" --model "$pool_gguf" load --endpoint "http://127.0.0.1:$port" \
      --label "pool $pool_mib MiB: kvbench serve $method" --task "$task" \
      --context-tokens "${POOL_CONTEXT:-3072}" --users "${POOL_USERS:-16}" --turns 1 \
      --concurrency "${POOL_USERS:-16}" "${pool_load[@]}" --db "$db"
    # The most sequences the pool held at once is the server's (/metrics), not the client's:
    # kept beside the db, with the whole metrics text.
    curl -s "http://127.0.0.1:$port/metrics" > "$out/metrics-pool-${method//[^a-z0-9]/_}.txt"
    echo "pool $pool_mib MiB, $method: $(grep '^kvbench_most_running_sequences' \
      "$out/metrics-pool-${method//[^a-z0-9]/_}.txt")" | tee -a "$out/pool.txt"
    stop_server
  done
fi

"$kvbench" report "$db" -o "$out"
