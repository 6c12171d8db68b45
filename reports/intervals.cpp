#include "reports/intervals.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

namespace kvbench {

std::string percent_with_interval(double value, const Interval& ci) {
  const auto text = [](double fraction) {
    const double percent = std::fabs(fraction) < 5e-4 ? 0.0 : fraction * 100;  // no "-0.0"
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", percent);
    return std::string(buf);
  };
  const std::string above = text(ci.high - value), below = text(value - ci.low);
  if (above == below) return text(value) + " ±" + above;
  return text(value) + " [" + text(ci.low) + ", " + text(ci.high) + "]";
}

namespace {

constexpr double kZ = 1.959963984540054;  // the normal's 97.5% quantile
constexpr uint32_t kSeed = 20240607;      // any fixed seed: the same db gives the same report

// The units a bootstrap resamples: the samples, or, when there is only one, its turns (one
// sample cannot show the spread between samples; its turns at least show their own).
std::vector<std::vector<double>> resampling_units(const std::vector<std::vector<double>>& scores) {
  if (scores.size() != 1) return scores;
  std::vector<std::vector<double>> turns;
  for (double s : scores[0]) turns.push_back({s});
  return turns;
}

double mean_of(const std::vector<std::vector<double>>& scores, int64_t* n) {
  double sum = 0;
  *n = 0;
  for (const auto& sample : scores) {
    for (double s : sample) sum += s;
    *n += static_cast<int64_t>(sample.size());
  }
  return *n > 0 ? sum / static_cast<double>(*n) : 0;
}

// The 2.5% and 97.5% order statistics of `stats` (sorted in place).
void percentile_bounds(std::vector<double>& stats, Interval* out) {
  std::sort(stats.begin(), stats.end());
  const auto at = [&](double q) {
    const double pos = q * static_cast<double>(stats.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos));
    const size_t hi = std::min(stats.size() - 1, lo + 1);
    return stats[lo] + (pos - static_cast<double>(lo)) * (stats[hi] - stats[lo]);
  };
  out->low = std::min(out->mean, at(0.025));
  out->high = std::max(out->mean, at(0.975));
}

}  // namespace

Interval wilson_interval(int64_t successes, int64_t n) {
  if (n <= 0) return {0, 0, 1, 0};
  const double nn = static_cast<double>(n);
  const double p = static_cast<double>(successes) / nn;
  const double z2 = kZ * kZ;
  const double center = (p + z2 / (2 * nn)) / (1 + z2 / nn);
  const double half = kZ / (1 + z2 / nn) * std::sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn));
  return {p, std::max(0.0, center - half), std::min(1.0, center + half), n};
}

Interval bootstrap_interval(const std::vector<std::vector<double>>& by_sample, int resamples) {
  Interval out;
  out.mean = mean_of(by_sample, &out.n);
  const std::vector<std::vector<double>> scores = resampling_units(by_sample);
  if (out.n == 0) return {0, 0, 1, 0};
  std::mt19937_64 rng(kSeed);
  std::uniform_int_distribution<size_t> pick(0, scores.size() - 1);
  std::vector<double> stats;
  stats.reserve(static_cast<size_t>(resamples));
  for (int r = 0; r < resamples; ++r) {
    double sum = 0;
    int64_t turns = 0;
    for (size_t i = 0; i < scores.size(); ++i) {
      const auto& sample = scores[pick(rng)];
      for (double s : sample) sum += s;
      turns += static_cast<int64_t>(sample.size());
    }
    if (turns > 0) stats.push_back(sum / static_cast<double>(turns));
  }
  percentile_bounds(stats, &out);
  return out;
}

Interval accuracy_interval(const std::vector<std::vector<double>>& scores) {
  int64_t n = 0, successes = 0;
  bool binary = true;
  for (const auto& sample : scores) {
    for (double s : sample) {
      binary = binary && (s == 0.0 || s == 1.0);
      successes += s == 1.0 ? 1 : 0;
      ++n;
    }
  }
  return binary ? wilson_interval(successes, n) : bootstrap_interval(scores);
}

Interval average_interval(const std::vector<std::vector<std::vector<double>>>& tasks,
                          int resamples) {
  Interval out;
  std::vector<std::vector<std::vector<double>>> units;  // per scored task
  for (const auto& task : tasks) {
    int64_t n = 0;
    const double m = mean_of(task, &n);
    if (n == 0) continue;
    out.mean += m;
    out.n += n;
    units.push_back(resampling_units(task));
  }
  std::vector<const std::vector<std::vector<double>>*> scored;
  for (const auto& u : units) scored.push_back(&u);
  if (scored.empty()) return {0, 0, 1, 0};
  out.mean /= static_cast<double>(scored.size());
  std::mt19937_64 rng(kSeed);
  std::vector<double> stats;
  stats.reserve(static_cast<size_t>(resamples));
  for (int r = 0; r < resamples; ++r) {
    double total = 0;
    for (const auto* task : scored) {
      std::uniform_int_distribution<size_t> pick(0, task->size() - 1);
      double sum = 0;
      int64_t turns = 0;
      for (size_t i = 0; i < task->size(); ++i) {
        const auto& sample = (*task)[pick(rng)];
        for (double s : sample) sum += s;
        turns += static_cast<int64_t>(sample.size());
      }
      total += turns > 0 ? sum / static_cast<double>(turns) : 0;
    }
    stats.push_back(total / static_cast<double>(scored.size()));
  }
  percentile_bounds(stats, &out);
  return out;
}

}  // namespace kvbench
