// The serving section of a report: what `kvbench load` measured at each concurrency level of
// each server and method (throughput, TTFT and inter-token percentiles, accuracy with its
// interval), as a Markdown table and as HTML with inline SVG charts: output tokens per second
// against concurrency, TTFT p50 and p99 against concurrency, and accuracy beside them, one
// line per server and method. Every string from the db is escaped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reports/intervals.h"
#include "store/results_db.h"

namespace kvbench {

// One concurrency level of one serving run.
struct ServingPoint {
  int64_t run_id = 0;
  std::string label;   // the server (and method)
  std::string method;
  int32_t concurrency = 0;
  int64_t pool_bytes = 0;
  int64_t requests = 0;
  int64_t failed = 0;            // answered with an error, or not at all
  int64_t output_tokens = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;     // prompt tokens the server said it reused
  double wall_s = 0;             // first request sent -> last answer received
  double output_tokens_per_s = 0;
  double requests_per_s = 0;
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  double itl_p50_ms = 0, itl_p99_ms = 0;
  double e2e_p50_ms = 0;
  Interval accuracy;             // a failed request scores 0: its user got no answer
};

// The point of one level's rows (one run, label, method and concurrency).
ServingPoint serving_point(const std::vector<ServingRow>& rows);
// Every level of every run in a db, by run, label, method and concurrency.
std::vector<ServingPoint> serving_points(const std::vector<ServingRow>& rows);

// "## Serving under load" and its table; "" when there are no points.
std::string render_serving_markdown(const std::vector<ServingPoint>& points);
// The same as an HTML section with its charts; "" when there are no points.
std::string render_serving_html(const std::vector<ServingPoint>& points);

}  // namespace kvbench
