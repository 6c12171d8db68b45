#!/bin/bash
# The layers' call rules (tests/check_layers.cmake states them for includes), checked on the
# built objects (ctest: test_layer_calls, label unit): a function, variable, vtable or
# typeinfo of namespace kvbench that an object of one layer uses but does not define must be
# defined in its own layer or one it may include. Includes alone miss a call through a
# declaration written by hand (the seam once called the methods' list that way). Inline and
# template code compiled into the caller counts as the caller's.
# Run: tests/check_layer_calls.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: check_layer_calls.sh BUILD_DIR}
# The rules are check_layers.cmake's own: its `set(allowed_LAYER "a;b;${allowed_OTHER}")`
# lines, each reference expanded, as "LAYER=a b ..." lines for awk.
declare -A allowed=()
rules=""
while IFS='=' read -r layer list; do
  while [[ $list =~ \$\{allowed_([a-z]+)\} ]]; do
    list=${list/"${BASH_REMATCH[0]}"/${allowed[${BASH_REMATCH[1]}]}}
  done
  allowed[$layer]=$list
  rules+="$layer=${list//;/ }"$'\n'
done < <(sed -n 's/^set(allowed_\([a-z]*\) "\(.*\)")$/\1=\2/p' "$(dirname "$0")/check_layers.cmake")
if ((${#allowed[@]} < 10)); then
  echo "tests/check_layer_calls.sh: no layer rules read from check_layers.cmake" >&2
  exit 1
fi
cd "$build"
# The libraries' and the program's objects (paths under .dir/ are the source's, from the
# tree's root), and the benchmarks' (bench/).
mapfile -t objects < <(find CMakeFiles bench/CMakeFiles -name '*.o' -path '*.dir/*' \
                         ! -path '*CompilerId*' 2>/dev/null | sort)
if ((${#objects[@]} < 100)); then
  echo "tests/check_layer_calls.sh: only ${#objects[@]} objects under $build: build it first" >&2
  exit 1
fi
nm -A "${objects[@]}" 2>/dev/null | awk -v rules="$rules" '
  # layer_of(source path): as tests/check_layers.cmake
  function layer_of(path,   top) {
    if (path ~ /^harness\/model\//) return "model"
    if (path ~ /^harness\/cli\//) return "cli"
    top = path; sub(/\/.*$/, "", top); return top
  }
  BEGIN {
    n = split(rules, lines, "\n")
    for (i = 1; i <= n; i++) {
      if (lines[i] == "") continue
      eq = index(lines[i], "="); allowed[substr(lines[i], 1, eq - 1)] = substr(lines[i], eq + 1)
    }
  }
  {
    # "OBJECT:  U SYMBOL" or "OBJECT:ADDRESS T SYMBOL"
    split($0, parts, ":"); object = parts[1]
    if (object ~ /^bench\/CMakeFiles\//) { source = object; sub(/^.*\.dir\//, "bench/", source) }
    else { source = object; sub(/^.*\.dir\//, "", source) }
    sub(/\.o$/, "", source)
    layer = layer_of(source)
    if (!(layer in allowed)) next
    type = $(NF - 1); symbol = $NF
    if (symbol !~ /7kvbench/) next
    if (type == "U") { uses[source SUBSEP symbol] = layer; n_uses++ }
    else if (type != "w" && type != "v") { definers[symbol] = definers[symbol] " " layer }
    objects_seen[source] = 1
  }
  END {
    bad = 0
    for (key in uses) {
      split(key, kv, SUBSEP); source = kv[1]; symbol = kv[2]; layer = uses[key]
      if (!(symbol in definers)) continue  # outside these objects: a test helper, a library
      n = split(definers[symbol], from, " "); ok = 0
      for (i = 1; i <= n; ++i) {
        if (from[i] == layer || index(" " allowed[layer] " ", " " from[i] " ")) { ok = 1; break }
      }
      if (!ok) { print source " (" layer ") uses " symbol " (defined in" definers[symbol] ")"; bad++ }
    }
    if (length(objects_seen) < 100 || n_uses < 1000) {
      print "tests/check_layer_calls.sh: read too little (" length(objects_seen) " objects, " \
            n_uses " uses)"; exit 1
    }
    if (bad) { print "(" bad " uses across layers: tests/check_layer_calls.sh)"; exit 1 }
    print "layer calls: " length(objects_seen) " objects, " n_uses " uses of kvbench symbols, all within their layers"
  }' | { out=$(cat); if [[ $out == layer\ calls:* ]]; then echo "$out"; else
          echo "$out" | c++filt | sort -t'(' -k1,1 | head -60; exit 1; fi; }
