// `kvbench report DB -o DIR` (leaderboard.md and .html) and `kvbench check DB --baseline
// FILE` (the CI gate: exit 1 on any regression; --write-baseline FILE writes one).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "common/files.h"
#include "common/input_error.h"
#include "harness/cli/commands.h"
#include "reports/aggregate.h"
#include "reports/leaderboard.h"
#include "reports/regression_check.h"
#include "store/results_db.h"

namespace kvbench {

void add_reference_option(CLI::App* cmd, std::string& reference) {
  cmd->add_option("--reference", reference,
                  "What the report's KV bytes are measured against: bf16 (default; the 16-bit "
                  "cache engines hold, from the db's bf16 rows) or fp32 (the full cache). KL "
                  "and top-1 are against the fp32 full cache either way")
      ->check(CLI::IsMember({"bf16", "fp32"}));
}

void write_reports_for(const std::string& db_path, const std::string& out_dir,
                       const std::string& reference) {
  write_reports(db_path, out_dir, parse_kv_reference(reference));
  const std::filesystem::path dir(out_dir);
  std::printf("report: %s and %s\n", (dir / "leaderboard.md").string().c_str(),
              (dir / "leaderboard.html").string().c_str());
  std::fflush(stdout);
}

void add_report_command(CLI::App& app) {
  struct ReportArgs {
    std::string db, out = "reports", reference = "bf16";
  };
  auto args = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand("report", "Write the leaderboard (Markdown and HTML) of a results db");
  cmd->add_option("db", args->db, "Results db")->required();
  cmd->add_option("-o,--output", args->out, "Directory for leaderboard.md and leaderboard.html");
  add_reference_option(cmd, args->reference);
  cmd->callback([args] { write_reports_for(args->db, args->out, args->reference); });

  struct CheckArgs {
    std::string db, baseline, write_baseline, tolerance;
  };
  auto check = std::make_shared<CheckArgs>();
  CLI::App* c = app.add_subcommand(
      "check", "Compare a results db with a baseline; exit 1 on any regression");
  c->add_option("db", check->db, "Results db")->required();
  auto* base = c->add_option("--baseline", check->baseline, "Baseline JSON to compare with");
  auto* write = c->add_option("--write-baseline", check->write_baseline,
                              "Write the db's aggregates as a baseline JSON instead");
  base->excludes(write);
  c->add_option("--tolerance", check->tolerance,
                "accuracy=0,fidelity=0.05,memory=0.05,speed=0.3 (the defaults; any subset)");
  c->callback([check] {
    if (check->baseline.empty() && check->write_baseline.empty()) {
      throw InputError("check needs --baseline FILE (or --write-baseline FILE)");
    }
    const Tolerances tolerances =
        check->tolerance.empty() ? Tolerances{} : parse_tolerances(check->tolerance);
    if (!check->write_baseline.empty()) {
      check_output_file(check->write_baseline, {check->db}, "--write-baseline");
    }
    const std::string baseline_text =
        check->baseline.empty() ? "" : read_regular_file(check->baseline, "baseline");
    const auto baseline =
        check->baseline.empty() ? std::vector<Aggregate>{} : parse_baseline(baseline_text, check->baseline);
    auto db = ResultsDb::open(check->db, /*read_only=*/true);
    const auto rows = aggregate_units(db->units());
    if (rows.empty()) throw InputError(check->db + ": no results to check");
    if (!check->write_baseline.empty()) {
      write_file_atomically(check->write_baseline, baseline_json(rows), "baseline");
      std::printf("check: baseline of %zu rows written to %s\n", rows.size(),
                  check->write_baseline.c_str());
      return;
    }
    const auto regressions = find_regressions(rows, baseline, tolerances);
    std::printf("%s%s", render_regressions(regressions, baseline.size()).c_str(),
                render_speed_margins(speed_margins(rows, baseline), tolerances).c_str());
    std::fflush(stdout);
    if (!regressions.empty()) throw CheckFailed{};
  });
}

}  // namespace kvbench
