// The leaderboard of a results db: Markdown, and one self-contained HTML page (no network,
// inline SVG charts). Every string that comes from the db is escaped.
#pragma once

#include <string>
#include <vector>

#include "reports/aggregate.h"
#include "reports/head_map.h"
#include "store/results_db.h"

namespace kvbench {

// leaderboard.md: the runs it covers (model sha, kvbench version, git sha), a method x task
// accuracy table with the average, each with half its 95% interval (reports/intervals.h),
// the tasks a run's config left out ("excluded_tasks") and why, then per method: KV memory
// vs full, TTFT, decode tok/s, fidelity (KL, top-1). Deterministic for the same db
// (golden-file tested).
std::string render_leaderboard_markdown(const std::vector<RunRecord>& runs,
                                        const std::vector<Aggregate>& rows);

// leaderboard.html: the same tables plus inline SVG charts: accuracy (with its interval as
// an error bar) vs KV bytes relative to the full cache per method, TTFT and memory per
// method, the kept tokens per layer and KV head of one sample (`head_maps`, a note when
// there are none), multi-turn accuracy by turn index.
std::string render_leaderboard_html(const std::vector<RunRecord>& runs,
                                    const std::vector<Aggregate>& rows,
                                    const std::vector<HeadMap>& head_maps = {});

// The HTML pages' style sheet: the leaderboard's and a serving db's report.
extern const char* const kReportStyle;

// `kvbench report DB -o DIR`: reads the db (read-only), writes DIR/leaderboard.md and
// DIR/leaderboard.html (creating DIR), each atomically (temp file + rename), KV bytes
// measured against `reference` (reports/aggregate.h). Throws InputError naming the db or
// the directory.
void write_reports(const std::string& db_path, const std::string& out_dir,
                   KvReference reference = KvReference::Bf16);

}  // namespace kvbench
