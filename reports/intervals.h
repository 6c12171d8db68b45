// 95% intervals for accuracies: Wilson's score interval when every score is 0 or 1 (each
// turn a trial), a percentile bootstrap over samples when some score is partial credit (a
// sample's turns share one context, so the sample is the unit resampled).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvbench {

struct Interval {
  double mean = 0;  // the point estimate, in [0, 1]
  double low = 0;   // 95% bounds
  double high = 0;
  int64_t n = 0;    // scored turns
  double half_width() const { return (high - low) / 2; }
};

// An accuracy in percent with its interval, to one decimal: "52.0 ±19.1" where the interval
// is symmetric about `value` as shown, else its ends, "0.0 [0.0, 7.1]" (Wilson's and the
// bootstrap's intervals are lopsided near 0 and 100%, where a "±" would claim what they
// do not).
std::string percent_with_interval(double value, const Interval& ci);

// Wilson's interval of `successes` of `n` trials (z = 1.96); {0, 0, 1, 0} for n = 0.
Interval wilson_interval(int64_t successes, int64_t n);

// Percentile bootstrap of the mean score over turns, resampling whole samples
// (scores[sample][turn]), or the turns of a lone sample; `resamples` draws from a fixed
// seed, so reports are reproducible.
Interval bootstrap_interval(const std::vector<std::vector<double>>& scores,
                            int resamples = 2000);

// The interval of an accuracy cell: Wilson when every score is 0 or 1, else the bootstrap.
Interval accuracy_interval(const std::vector<std::vector<double>>& scores);

// The mean of several tasks' accuracies with its interval: a bootstrap that resamples the
// samples within each task (tasks[task][sample][turn]) and averages the task means.
Interval average_interval(const std::vector<std::vector<std::vector<double>>>& tasks,
                          int resamples = 2000);

}  // namespace kvbench
