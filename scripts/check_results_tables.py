#!/usr/bin/env python3
"""docs/results.md's leaderboard tables against the committed dbs they come from.

Merges each table's shards (results/long/, results/leaderboard_1.5b/), renders them with
`kvbench report`, and compares every cell of the docs' table with the report's cell for the
same method and budget, as text: the accuracy and its interval exactly as the report prints
them. Prints each difference and exits 1 on any (0 when all agree); a table or a row it
cannot find is a difference too. ctest runs it (docs_tables, label unit).

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
    ("below mean anything:", "results/long/long-*-of-20.db", "niah"),
    ("**Retr.KV at 4K, ten samples**", "results/long/long-*-of-20.db", "retr\\_kv"),
    ("every cell as `kvbench report` prints it from the committed shards):",
     "results/long/long-*-of-20.db", "average"),
    ("Ten samples of 5 turns are 50 turns a cell:", "results/leaderboard_1.5b/lb15-*-of-10.db",
     "average"),
]


def report_accuracy(kvbench, pattern, work):
    """{(spec, budget): {column: cell}} from `kvbench report` of the merged shards."""
    shards = sorted(glob.glob(os.path.join(ROOT, pattern)))
    if not shards:
        sys.exit(f"check_results_tables: no shards match {pattern}")
    name = re.sub(r"[^a-z0-9]", "_", pattern)
    db, out = os.path.join(work, name + ".db"), os.path.join(work, name)
    subprocess.run([kvbench, "merge", *shards, "-o", db, "--allow-mixed-commits"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([kvbench, "report", db, "-o", out], check=True, stdout=subprocess.DEVNULL)
    md = open(os.path.join(out, "leaderboard.md"), encoding="utf-8").read()
    section = md[md.index("## Accuracy (%)"):md.index("\n## ", md.index("## Accuracy (%)") + 1)]
    rows, header = {}, None
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "method":
            header = cells
            continue
        rows[(cells[0].replace("\\_", "_"), cells[1])] = dict(zip(header, cells))
    return rows


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
    """The header and rows of the first table after the line containing `anchor`."""
    at = next((i for i, l in enumerate(lines) if anchor in l), None)
    if at is None:
        return None, []
    i = at + 1
    while i < len(lines) and not lines[i].startswith("|"):
        i += 1
    table = []
    while i < len(lines) and lines[i].startswith("|"):
        table.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
        i += 1
    return (table[0], table[2:]) if len(table) > 2 else (None, [])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvbench", default=os.path.join(ROOT, "build", "kvbench"))
    parser.add_argument("--docs", default=os.path.join(ROOT, "docs", "results.md"))
    args = parser.parse_args()
    lines = open(args.docs, encoding="utf-8").read().splitlines()
    differences, checked = [], 0
    with tempfile.TemporaryDirectory() as work:
        reports = {}
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
    print(f"check_results_tables: {checked} cells of {len(TABLES)} tables, "
          f"{len(differences)} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
