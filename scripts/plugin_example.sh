#!/usr/bin/env bash
# The out-of-tree method as a researcher builds it (docs/methods.md, "Write your own method"):
# kvbench installed into a temporary prefix, examples/plugin_method built against it with
# find_package(kvbench), a small sweep run by the installed kvbench with the plugin, and the
# plugin's Knorm held equal to the built-in one, row by row (answers, bytes, fidelity).
# Run by CI after ./scripts/test, from its build folder (KVBENCH_BUILD_DIR, default build).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KVBENCH_BUILD_DIR:-build}"
case "$build" in /*) ;; *) build="$root/$build" ;; esac
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
echo "plugin example: installed kvbench into a temporary prefix ($(find "$work/prefix" -type f | wc -l) files)"
cmake -S "$root/examples/plugin_method" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log"
cmake --build "$work/build" > "$work/build.log"
plugin="$work/build/libexample_methods.so"
echo "plugin example: built $(basename "$plugin") out of the tree"

export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
"$work/prefix/bin/kvbench" --plugin "$plugin" list methods | grep -A1 -E "^(example_knorm|value_attention|vatp_h2o)$"
"$work/prefix/bin/kvbench" --plugin "$plugin" sweep "$root/examples/plugin_method/sweep.json" \
  --db "$work/example.db"
"$work/prefix/bin/kvbench" report "$work/example.db" -o "$work/report" > /dev/null
grep -E "^\| (full|knorm|example\\\\_knorm|value\\\\_attention|adakv)" "$work/report/leaderboard.md" | head -5
python3 - "$work/example.db" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
def rows(method):
    return db.execute(
        "SELECT sample_id, turn, prediction, kv_bytes, kv_bytes_peak, tokens_kept, "
        "first_token_kl, top1_agreement FROM results WHERE method = ? ORDER BY sample_id, turn",
        (method,)).fetchall()
builtin = rows("knorm:ratio=0.5,skip=2")
plugin = rows("example_knorm:ratio=0.5,window=0,sink=0,skip=2")
if not builtin or builtin != plugin:
    sys.exit("plugin example: example_knorm's rows differ from knorm's:\n%r\n%r" % (builtin, plugin))
print("plugin example: example_knorm equals the built-in knorm on %d turns "
      "(answers, bytes, kept tokens, KL, top-1)" % len(builtin))
# The full policy ran alone and under adakv+, its heads at their own counts there.
for pattern in ("vatp_h2o:%", "adakv:%+vatp_h2o:%"):
    n = db.execute("SELECT COUNT(*) FROM results WHERE method LIKE ?", (pattern,)).fetchone()[0]
    if n == 0:
        sys.exit("plugin example: no rows for %s" % pattern)
heads = db.execute("SELECT head_tokens FROM units WHERE method LIKE 'adakv:%+vatp_h2o:%'").fetchone()[0]
if not any(len(set(layer)) > 1 for layer in __import__("json").loads(heads)):
    sys.exit("plugin example: adakv+vatp_h2o's heads hold equal counts: %s" % heads)
print("plugin example: vatp_h2o (a full policy) ran alone and under adakv+, heads uneven there")
PY
