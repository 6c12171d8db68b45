// The interval math of the reports: Wilson's interval against hand-computed values, the
// bootstrap's determinism and coverage, and which one a cell gets.
#include <catch2/catch.hpp>

#include <vector>

#include "reports/intervals.h"

using namespace kvbench;

TEST_CASE("intervals: Wilson's score interval at hand-computed points", "[unit]") {
  // 8/10: center (0.8 + 1.92/10) / 1.384 = 0.7168, half 1.96/1.384 * sqrt(0.016 + 0.00096)
  const Interval a = wilson_interval(8, 10);
  CHECK(a.mean == Approx(0.8));
  CHECK(a.low == Approx(0.4902).margin(1e-4));
  CHECK(a.high == Approx(0.9433).margin(1e-4));
  CHECK(a.n == 10);
  const Interval none = wilson_interval(0, 5);
  CHECK(none.low == 0.0);
  CHECK(none.high == Approx(0.4345).margin(1e-4));
  const Interval five = wilson_interval(5, 5);  // the mirror of 0/5
  CHECK(five.low == Approx(0.5655).margin(1e-4));
  CHECK(five.high == 1.0);
  CHECK(five.half_width() == Approx(none.half_width()));
  const Interval all = wilson_interval(20, 20);
  CHECK(all.low == Approx(0.8389).margin(1e-4));
  CHECK(all.high == 1.0);
  const Interval one = wilson_interval(1, 1);
  CHECK(one.low == Approx(0.2065).margin(1e-4));
  CHECK(one.high == 1.0);
  const Interval miss = wilson_interval(0, 1);
  CHECK(miss.low == 0.0);
  CHECK(miss.high == Approx(0.7935).margin(1e-4));
  const Interval empty = wilson_interval(0, 0);
  CHECK(empty.low == 0.0);
  CHECK(empty.high == 1.0);
  CHECK(empty.n == 0);
  // 25 turns, all right: the half-width the default sweep's full cache must stay under.
  CHECK(wilson_interval(25, 25).half_width() * 100 < 15);
  CHECK(wilson_interval(20, 25).half_width() * 100 < 16.5);
}

TEST_CASE("intervals: binary cells get Wilson's, partial credit the bootstrap", "[unit]") {
  const std::vector<std::vector<double>> binary = {{1, 0, 1}, {1, 1, 0}, {0, 1, 1}};
  const Interval w = accuracy_interval(binary);
  CHECK(w.low == Approx(wilson_interval(6, 9).low));
  CHECK(w.high == Approx(wilson_interval(6, 9).high));
  const std::vector<std::vector<double>> partial = {{1, 0.5, 1}, {1, 1, 0}, {0, 1, 1}};
  const Interval b = accuracy_interval(partial);
  CHECK(b.mean == Approx(6.5 / 9));
  CHECK(b.low == Approx(bootstrap_interval(partial).low));
  CHECK(b.low != Approx(wilson_interval(6, 9).low));
}

TEST_CASE("intervals: the bootstrap is deterministic, contains the mean, narrows with n",
          "[unit]") {
  std::vector<std::vector<double>> few, many;
  for (int s = 0; s < 4; ++s) few.push_back({s % 2 ? 1.0 : 0.5, 0.5, s % 3 ? 1.0 : 0.0});
  for (int r = 0; r < 10; ++r) many.insert(many.end(), few.begin(), few.end());
  const Interval a = bootstrap_interval(few), again = bootstrap_interval(few);
  CHECK(a.low == again.low);
  CHECK(a.high == again.high);
  CHECK(a.low <= a.mean);
  CHECK(a.mean <= a.high);
  CHECK(a.low < a.high);
  const Interval wide = bootstrap_interval(many);
  CHECK(wide.mean == Approx(a.mean));
  CHECK(wide.half_width() < a.half_width() * 0.5);
  // Samples that all score the same have no spread to show.
  const Interval flat = bootstrap_interval({{0.5, 0.5}, {0.5, 0.5}});
  CHECK(flat.low == Approx(0.5));
  CHECK(flat.high == Approx(0.5));
  // A lone sample: its turns are resampled, so the interval is not a point.
  const Interval lone = bootstrap_interval({{1, 0.5, 0}});
  CHECK(lone.low < 0.5);
  CHECK(lone.high > 0.5);
}

TEST_CASE("intervals: the average over tasks resamples within each task", "[unit]") {
  const std::vector<std::vector<double>> good = {{1, 1}, {1, 1}, {1, 0}};
  const std::vector<std::vector<double>> bad = {{0, 0}, {0, 1}, {0, 0}};
  const Interval avg = average_interval({good, bad});
  CHECK(avg.mean == Approx((5.0 / 6 + 1.0 / 6) / 2));
  CHECK(avg.low <= avg.mean);
  CHECK(avg.high >= avg.mean);
  CHECK(avg.n == 12);
  // Tasks without scores are left out of the mean.
  CHECK(average_interval({good, {}}).mean == Approx(5.0 / 6));
  CHECK(average_interval({}).n == 0);
}

TEST_CASE("intervals: shown as ± where symmetric, else as their ends", "[unit]") {
  // Wilson's interval is symmetric at one half, lopsided near 0 and 100%.
  CHECK(percent_with_interval(0.5, wilson_interval(25, 50)) == "50.0 ±13.4");
  CHECK(percent_with_interval(0.0, wilson_interval(0, 50)) == "0.0 [0.0, 7.1]");
  CHECK(percent_with_interval(0.8, wilson_interval(16, 20)) == "80.0 [58.4, 91.9]");
  CHECK(percent_with_interval(1.0, wilson_interval(20, 20)) == "100.0 [83.9, 100.0]");
  // Equal to the shown decimal counts as symmetric.
  CHECK(percent_with_interval(0.5, Interval{0.5, 0.41, 0.5904, 10}) == "50.0 ±9.0");
}
