#include "reports/leaderboard.h"

#include <filesystem>

#include "common/files.h"
#include "common/input_error.h"
#include "reports/head_map.h"
#include "reports/serving_report.h"

namespace kvbench {

void write_reports(const std::string& db_path, const std::string& out_dir,
                   KvReference reference) {
  std::vector<RunRecord> runs;
  std::vector<UnitRecord> units;
  std::vector<ServingRow> serving;
  {
    auto db = ResultsDb::open(db_path, /*read_only=*/true);
    runs = db->runs();
    units = db->units();
    serving = db->serving_rows();
  }
  if (units.empty() && serving.empty()) {
    throw InputError("DB: no results to report (" + db_path + ")");
  }
  const std::filesystem::path dir(out_dir);
  const std::string md_path = (dir / "leaderboard.md").string();
  const std::string html_path = (dir / "leaderboard.html").string();
  check_output_file(md_path, {db_path}, "-o");
  check_output_file(html_path, {db_path}, "-o");
  const std::vector<Aggregate> rows = aggregate_units(units, reference);
  const std::vector<ServingPoint> points = serving_points(serving);
  std::string md, html;
  if (units.empty()) {  // a db of serving runs alone
    md = "# kvbench serving report\n\n" + render_serving_markdown(points);
    html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
           "<title>kvbench serving report</title>\n<style>\n" + std::string(kReportStyle) +
           "</style>\n</head>\n<body>\n<h1>kvbench serving report</h1>\n" +
           render_serving_html(points) + "</body>\n</html>\n";
  } else {
    md = render_leaderboard_markdown(runs, rows);
    html = render_leaderboard_html(runs, rows, first_sample_head_maps(units));
    if (!points.empty()) {
      md += "\n" + render_serving_markdown(points);
      html.insert(html.rfind("</body>"), render_serving_html(points));
    }
  }

  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec || !std::filesystem::is_directory(out_dir, ec)) {
    throw InputError("OUT_DIR: cannot create the report directory (" + out_dir + ": " +
                     (ec ? ec.message() : std::string("not a directory")) + ")");
  }
  write_files_atomically({{md_path, md}, {html_path, html}}, "report");
}

}  // namespace kvbench
