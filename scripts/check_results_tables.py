#!/usr/bin/env python3
"""docs/results.md's leaderboard tables against the committed dbs they come from.

Merges each table's shards (results/long-ae0cccc/, results/leaderboard_1.5b/, results/long_8k/), renders them with
`kvbench report`, and compares every cell of the docs' table with the report's cell for the
same method and budget, as text: the accuracy and its interval exactly as the report prints
them. The tables of one db each (results/short/: the 512-token sweeps and the default run)
are excerpts of the report: a row per (method spec as the report prints it, budget), its
columns any of the report's (accuracy per task, KV vs bf16, KL, top-1 %, ...), each cell as
the report prints it for the table's mode. Prints each difference and exits 1 on any (0 when
all agree); a table or a row it cannot find is a difference too. ctest runs it (docs_tables,
label unit). `--print ANCHOR` prints the table after that line as the report has it.

    scripts/check_results_tables.py --kvbench build/kvbench
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMN_BUDGETS = {"1/2": "ratio=0.5", "1/4": "ratio=0.25", "1/8": "ratio=0.125",
                  "1/16": "ratio=0.0625", "no budget": "–"}

# (the line before the table contains this, shards, the report's column)
TABLES = [
    ("below mean anything:", "results/long-ae0cccc/long-*-of-20.db", "niah"),
    ("**Retr.KV at 4K, ten samples**", "results/long-ae0cccc/long-*-of-20.db", "retr\\_kv"),
    ("every cell as `kvbench report` prints it from the committed shards):",
     "results/long-ae0cccc/long-*-of-20.db", "average"),
    ("Ten samples of 5 turns are 50 turns a cell:", "results/leaderboard_1.5b/lb15-*-of-10.db",
     "average"),
    ("shards by `scripts/check_results_tables.py`):", "results/long_8k/shard-*.db", "niah"),
]


# Excerpts of one db's report: (docs file, the line before the table contains this, db,
# mode). The table's header names the report's columns after "method" and "budget" (and
# "mode" where its rows give theirs: mode None); a mode names the rows' mode for a table
# without that column, "" the report's tables whose columns are the modes or the turns.
EXCERPTS = [
    ("README.md", "What it\nprinted:", "results/short/default.db", "multi-turn"),
    ("docs/results.md", "(`configs/default.json`) measured", "results/short/default.db",
     "multi-turn"),
    ("docs/results.md", "**Storage methods side by side.**", "results/short/storage.db",
     "multi-turn"),
    ("docs/results.md", "**Scoring rules side by side.**", "results/short/scoring.db",
     "multi-turn"),
    ("docs/results.md", "**EpiCache in both modes.**", "results/short/epicache.db", None),
    ("docs/results.md", "**Budgets per layer and per head.**", "results/short/allocation.db",
     "multi-turn"),
    ("docs/results.md", "**Head-wise budgets over packed and narrow stores.**",
     "results/short/head_split.db", "multi-turn"),
    ("docs/results.md", "**SCBench's headline on kvbench's tasks.**",
     "results/short/scbench_headline.db", ""),
    ("docs/results.md", "**SCBench's headline at 4K tokens on natural text.**",
     "results/long/scbench_headline_4k.db", ""),
    ("docs/results.md", "Query-aware (`results/long/scbench_headline_4k_aware.db`",
     "results/long/scbench_headline_4k_aware.db", ""),
]


def report_rows(kvbench, db, work):
    """{(spec, budget, mode): {column: cell}} over every table of the report that starts with
    method and budget, as the report prints them: mode "" for the tables without a mode
    column (modes side by side, accuracy by turn)."""
    out = os.path.join(work, re.sub(r"[^a-z0-9]", "_", db))
    subprocess.run([kvbench, "report", os.path.join(ROOT, db), "-o", out], check=True,
                   stdout=subprocess.DEVNULL)
    rows, header = {}, None
    for line in open(os.path.join(out, "leaderboard.md"), encoding="utf-8"):
        if line.startswith("|---"):
            continue
        if not line.startswith("| "):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
            continue
        if header[:2] != ["method", "budget"]:
            continue
        # Tables with a mode column, and those whose columns are the modes or the turns
        # (mode "" in the key).
        first, mode = (3, cells[2]) if header[2] == "mode" else (2, "")
        for name, cell in zip(header[first:], cells[first:]):
            rows.setdefault((cells[0], cells[1], mode), {}).setdefault(name, cell)
    return rows


def names_of(spec):
    """The methods of a spec without their parameters: "adakv+snapkv" for
    "adakv:floor=0.2+snapkv:ratio=0.5,window=32"."""
    return "+".join(part.split(":")[0] for part in spec.split("+"))


def check_excerpt(lines, anchor, rows, mode, differences):
    """Each cell of the docs' table after `anchor` against the report's. Returns cells checked."""
    header, table = docs_table(lines, anchor)
    if header is None:
        differences.append(f"no table after a line containing {anchor!r}")
        return 0
    checked = 0
    if not table:
        differences.append(f"the table after {anchor!r} has no rows")
    for row in table:
        values = dict(zip(header, row))
        label, budget, row_mode = values.get("method"), values.get("budget"), values.get("mode", mode)
        where = f"{anchor[:40]!r}: {label} | {budget} | {row_mode}"
        # The report's spec, or its methods' names alone where one spec has them and the budget.
        found = [key for key in rows if key[1] == budget and key[2] == row_mode and
                 (key[0] == label or (":" not in label and names_of(key[0]) == label))]
        if len(found) != 1:
            differences.append(f"{where}: {len(found)} report rows match")
            continue
        for name in header:
            if name in ("method", "budget", "mode"):
                continue
            if rows[found[0]].get(name) != values[name]:
                differences.append(f"{where} {name}: docs {values[name]!r}, report "
                                   f"{rows[found[0]].get(name)!r}")
            checked += 1
    return checked


def report_accuracy(kvbench, pattern, work):
    """{(spec, budget): {column: cell}} from `kvbench report` of the merged shards (every
    shard of these sweeps is multi-turn)."""
    shards = sorted(glob.glob(os.path.join(ROOT, pattern)))
    if not shards:
        sys.exit(f"check_results_tables: no shards match {pattern}")
    db = os.path.join(work, re.sub(r"[^a-z0-9]", "_", pattern) + ".db")
    subprocess.run([kvbench, "merge", *shards, "-o", db, "--allow-mixed-commits"], check=True,
                   stdout=subprocess.DEVNULL)
    return {(spec.replace("\\_", "_"), budget): cells
            for (spec, budget, mode), cells in report_rows(kvbench, db, work).items()
            if mode == "multi-turn"}


def matches(label, spec):
    """Whether the docs' row label names this spec (labels are the method's short name)."""
    label = label.replace("\\_", "_").split(" (")[0]
    if label in ("full", "bf16"):
        return spec == label
    if label.startswith("kivi "):
        return spec.startswith("kivi:bits=" + label.split()[1] + ",")
    if label == "adakv+snapkv":
        return spec.startswith("adakv:") and "+snapkv:" in spec
    if label == "snapkv+kivi 2 bits":
        return spec.startswith("snapkv:") and "+kivi:bits=2," in spec
    return spec.startswith(label + ":") and "+" not in spec


def docs_table(lines, anchor):
    """The header and rows of the first table after the line containing `anchor` (an anchor
    with a newline: two lines, the second right after the first)."""
    first, _, second = anchor.partition("\n")
    at = next((i for i, l in enumerate(lines)
               if first in l and (not second or (i + 1 < len(lines) and second in lines[i + 1]))),
              None)
    if at is not None and second:
        at += 1
    if at is None:
        return None, []
    i = at + 1
    while i < len(lines) and not lines[i].startswith("|"):
        i += 1
    table = []
    while i < len(lines) and lines[i].startswith("|"):
        table.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
        i += 1
    return (table[0], table[2:]) if len(table) >= 2 else (None, [])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvbench", default=os.path.join(ROOT, "build", "kvbench"))
    parser.add_argument("--docs", default=os.path.join(ROOT, "docs", "results.md"))
    parser.add_argument("--print", dest="show", metavar="ANCHOR",
                        help="print the excerpt table after ANCHOR from its db's report")
    args = parser.parse_args()
    lines = open(args.docs, encoding="utf-8").read().splitlines()
    differences, checked = [], 0
    with tempfile.TemporaryDirectory() as work:
        reports = {}  # a db's or a shard pattern's rows, each reported once
        for docs, anchor, db, mode in EXCERPTS:
            if args.show and args.show not in anchor:
                continue
            if db not in reports:
                reports[db] = report_rows(args.kvbench, db, work)
            rows = reports[db]
            text = open(os.path.join(ROOT, docs), encoding="utf-8").read().splitlines()
            if args.show:
                header, table = docs_table(text, anchor)
                header = header or ["method", "budget"]
                print("| " + " | ".join(header) + " |")
                print("|" + "|".join("---" if h in ("method", "budget", "mode") else "---:"
                                     for h in header) + "|")
                for (spec, budget, m), cells in rows.items():
                    if (mode is None and m) or m == mode:
                        name = names_of(spec)
                        same = [k for k in rows if k[1] == budget and k[2] == m and
                                names_of(k[0]) == name]
                        short = name if len(same) == 1 else spec
                        values = {"method": short, "budget": budget, "mode": m, **cells}
                        print("| " + " | ".join(values.get(h, "?") for h in header) + " |")
                return 0
            checked += check_excerpt(text, anchor, rows, mode, differences)
        for anchor, pattern, column in TABLES:
            if pattern not in reports:
                reports[pattern] = report_accuracy(args.kvbench, pattern, work)
            report = reports[pattern]
            header, rows = docs_table(lines, anchor)
            if header is None:
                differences.append(f"no table after a line containing {anchor!r}")
                continue
            for row in rows:
                for name, cell in zip(header[1:], row[1:]):
                    if not cell:
                        continue
                    budget = COLUMN_BUDGETS[name]
                    found = [r for (spec, b), r in report.items()
                             if b == budget and matches(row[0], spec)]
                    where = f"{anchor[:40]!r}: {row[0]} at {name}"
                    if len(found) != 1:
                        differences.append(f"{where}: {len(found)} report rows match")
                    elif found[0].get(column) != cell:
                        differences.append(f"{where}: docs {cell!r}, report {found[0].get(column)!r}")
                    checked += 1
    for d in differences:
        print("check_results_tables: " + d)
    print(f"check_results_tables: {checked} cells of {len(TABLES) + len(EXCERPTS)} tables, "
          f"{len(differences)} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
