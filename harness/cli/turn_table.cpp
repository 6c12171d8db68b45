#include "harness/cli/turn_table.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace kvbench {

namespace {

double mib(double bytes) { return bytes / 1048576.0; }

// Length of the valid UTF-8 sequence at text[i], 0 when the bytes there are not one.
size_t utf8_length(const std::string& text, size_t i) {
  const unsigned char c = static_cast<unsigned char>(text[i]);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return 0;
  }
  return n;
}

// Answer text for one table cell: control characters escaped, bytes that are not UTF-8
// (a model can emit half a character) shown as '?', at most `width` characters, quoted.
std::string cell_text(const std::string& text, size_t width) {
  std::string out;
  size_t chars = 0;
  for (size_t i = 0; i < text.size();) {
    if (chars == width) {
      out += "...";
      break;
    }
    ++chars;
    const size_t n = utf8_length(text, i);
    const char c = text[i];
    if (n == 0) {
      out += '?';
      ++i;
      continue;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (n == 1 && static_cast<unsigned char>(c) < 0x20) {
      out += '?';
    } else {
      out.append(text, i, n);
    }
    i += n;
  }
  return "\"" + out + "\"";
}

std::string lower_trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  std::string t = s.substr(a, s.find_last_not_of(" \t\r\n") - a + 1);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  return t;
}

// For samples without a task: a rough check, not a scorer: some accepted answer occurs in
// the prediction (case-insensitive).
bool answer_found(const std::string& prediction, const SampleTurn& turn) {
  const std::string p = lower_trimmed(prediction);
  for (const std::string& a : turn.answers) {
    const std::string t = lower_trimmed(a);
    if (!t.empty() && p.find(t) != std::string::npos) return true;
  }
  return false;
}

// What prefix reuse did for a turn's request, under its row.
void print_reuse(const ReuseTurn& r) {
  std::printf("     reuse: %lld of %lld prompt tokens loaded (%.1f%%)", static_cast<long long>(r.tokens_reused),
              static_cast<long long>(r.tokens_looked_up), 100.0 * r.hit_ratio());
  if (r.blocks_hit > 0) {
    std::printf(" from %s, %.2f MiB in %.1f ms", r.served_by.c_str(),
                mib(static_cast<double>(r.bytes_loaded)), r.load_ms);
  }
  std::printf("; %s %lld %s%s (%.2f MiB) in %.1f ms", r.documents ? "prefilled" : "stored",
              static_cast<long long>(r.blocks_stored), r.documents ? "document" : "block",
              r.blocks_stored == 1 ? "" : "s", mib(static_cast<double>(r.bytes_stored)), r.store_ms);
  if (!r.faults.empty()) std::printf("; faults: %s", r.faults.c_str());
  std::printf("\n");
}

}  // namespace

void print_unit(const UnitResult& unit) {
  const Sample& sample = *unit.sample;
  const SessionResult& r = unit.session;
  const bool scored = !unit.scores.empty();
  std::printf("\nmethod: %s\nsample %s: context %lld tokens", r.method.c_str(), sample.id.c_str(),
              static_cast<long long>(r.context_tokens));
  if (r.mode == SessionMode::MultiTurn) {
    std::printf(" (prefill + compression %.1f ms)", r.context_prefill_ms);
  }
  std::printf(", %zu turn%s\n", r.turns.size(), r.turns.size() == 1 ? "" : "s");
  std::printf("%4s %7s %9s %8s %7s %8s %8s %10s %8s %6s %5s %5s  %s\n", "turn", "prompt",
              "TTFT ms", "TPOT ms", "tok/s", "KV MiB", "peak MiB", "kept/layer", "KL", "top-1",
              "trunc", "score", "prediction | reference");
  double ttft = 0, tpot = 0, kl = 0, top1 = 0, score = 0;
  int64_t peak = 0;
  int found = 0, tpot_n = 0;
  for (size_t i = 0; i < r.turns.size(); ++i) {
    const TurnRecord& t = r.turns[i];
    char kl_text[32] = "-", top1_text[32] = "-", score_text[32] = "-";
    if (r.fidelity) {
      std::snprintf(kl_text, sizeof kl_text, "%.4f", t.first_token_kl);
      std::snprintf(top1_text, sizeof top1_text, "%.3f", t.top1_agreement);
    }
    if (scored) {
      std::snprintf(score_text, sizeof score_text, "%.2f", unit.scores[i]);
      score += unit.scores[i];
    }
    const bool truncated = t.stop_reason != "end_of_turn";
    std::printf("%4d %7lld %9.1f %8.1f %7.1f %8.2f %8.2f %10.1f %8s %6s %5s %5s  %s | %s\n",
                t.turn, static_cast<long long>(t.prompt_tokens), t.ttft_ms, t.tpot_ms,
                t.decode_tokens_per_s, mib(static_cast<double>(t.kv_bytes)),
                mib(static_cast<double>(t.kv_bytes_peak)), t.tokens_kept, kl_text, top1_text,
                truncated ? "yes" : "no", score_text, cell_text(t.prediction, 40).c_str(),
                cell_text(t.reference, 40).c_str());
    if (t.reuse.tokens_looked_up > 0) print_reuse(t.reuse);
    ttft += t.ttft_ms;
    if (t.tpot_ms > 0) {
      tpot += t.tpot_ms;
      ++tpot_n;
    }
    kl += t.first_token_kl;
    top1 += t.top1_agreement;
    peak = std::max(peak, t.kv_bytes_peak);
    found += answer_found(t.prediction, sample.turns[static_cast<size_t>(t.turn - 1)]);
  }
  const double n = static_cast<double>(std::max<size_t>(r.turns.size(), 1));
  if (!r.turns.empty()) {
    for (const TierStats& tier : r.turns.back().reuse_tiers) {
      std::printf("tier %-6s %8.2f MiB resident in %lld entries | %lld hits, %lld misses | "
                  "%.2f MiB in, %.2f MiB out | load %.1f ms, store %.1f ms | %lld evictions, "
                  "%lld faults%s%s\n",
                  tier.name.c_str(), mib(static_cast<double>(tier.bytes_resident)),
                  static_cast<long long>(tier.entries), static_cast<long long>(tier.hits),
                  static_cast<long long>(tier.misses), mib(static_cast<double>(tier.bytes_in)),
                  mib(static_cast<double>(tier.bytes_out)), tier.load_ms, tier.store_ms,
                  static_cast<long long>(tier.evictions), static_cast<long long>(tier.faults),
                  tier.last_fault.empty() ? "" : ", last: ", tier.last_fault.c_str());
    }
  }
  std::printf("summary %s: %zu turn%s | mean TTFT %.1f ms | mean TPOT %.1f ms | KV %.2f MiB after "
              "the last turn, peak %.2f MiB | ",
              sample.id.c_str(), r.turns.size(), r.turns.size() == 1 ? "" : "s", ttft / n,
              tpot_n ? tpot / tpot_n : 0.0,
              r.turns.empty() ? 0.0 : mib(static_cast<double>(r.turns.back().kv_bytes)),
              mib(static_cast<double>(peak)));
  if (r.fidelity) {
    std::printf("mean KL %.4f | mean top-1 %.3f | ", kl / n, top1 / n);
  } else {
    std::printf("no fidelity | ");
  }
  if (scored) {
    std::printf("score %.3f\n", score / n);
  } else {
    std::printf("answer found in prediction %d/%zu\n", found, r.turns.size());
  }
  std::fflush(stdout);
}

void SummaryTable::add(const UnitResult& unit) {
  const SessionResult& r = unit.session;
  const Key key{unit.sample->task.empty() ? "-" : unit.sample->task, to_string(r.mode), r.method};
  auto [it, fresh] = rows_.try_emplace(key);
  if (fresh) order_.push_back(key);
  Totals& t = it->second;
  t.fidelity = r.fidelity;
  for (size_t i = 0; i < r.turns.size(); ++i) {
    const TurnRecord& turn = r.turns[i];
    ++t.turns;
    t.kl += turn.first_token_kl;
    t.top1 += turn.top1_agreement;
    t.ttft_ms += turn.ttft_ms;
    t.prompt_tokens += turn.prompt_tokens;
    t.tokens_reused += turn.reuse.tokens_reused;
    t.kv_bytes += static_cast<double>(turn.kv_bytes);
    t.kv_peak = std::max(t.kv_peak, turn.kv_bytes_peak);
    if (turn.decode_tokens_per_s > 0) {
      t.decode_tps += turn.decode_tokens_per_s;
      t.kv_read += static_cast<double>(turn.kv_read_per_step);
      ++t.timed;
    }
    if (!unit.scores.empty()) {
      const size_t index = static_cast<size_t>(turn.turn - 1);
      if (t.score_by_turn.size() <= index) {
        t.score_by_turn.resize(index + 1, 0.0);
        t.scored_by_turn.resize(index + 1, 0);
      }
      t.score += unit.scores[i];
      t.score_by_turn[index] += unit.scores[i];
      ++t.scored_by_turn[index];
      ++t.scored;
    }
  }
}

void SummaryTable::print() const {
  std::printf("\n%-20s %-13s %-44s %5s %6s %8s %6s %9s %7s %8s %8s %6s %9s %8s  %s\n", "task",
              "mode", "method", "turns", "acc %", "KL", "top-1", "TTFT ms", "tok/s", "KV MiB",
              "peak MiB", "vs full", "read KiB", "reused %", "acc % by turn");
  for (const Key& key : order_) {
    const Totals& t = rows_.at(key);
    const double n = static_cast<double>(std::max<int64_t>(t.turns, 1));
    char acc[32] = "-", kl[32] = "-", top1[32] = "-", ratio[32] = "-";
    if (t.scored) std::snprintf(acc, sizeof acc, "%.1f", 100.0 * t.score / t.scored);
    if (t.fidelity) {
      std::snprintf(kl, sizeof kl, "%.4f", t.kl / n);
      std::snprintf(top1, sizeof top1, "%.3f", t.top1 / n);
    }
    // Memory against the full cache on the same task and mode.
    for (const Key& other : order_) {
      if (std::get<0>(other) == std::get<0>(key) && std::get<1>(other) == std::get<1>(key) &&
          std::get<2>(other) == "full") {
        const Totals& full = rows_.at(other);
        const double full_mean = full.kv_bytes / static_cast<double>(std::max<int64_t>(full.turns, 1));
        if (full_mean > 0) std::snprintf(ratio, sizeof ratio, "%.3f", (t.kv_bytes / n) / full_mean);
      }
    }
    std::string by_turn;
    for (size_t i = 0; i < t.score_by_turn.size(); ++i) {
      char cell[32] = "-";
      if (t.scored_by_turn[i]) {
        std::snprintf(cell, sizeof cell, "%.0f", 100.0 * t.score_by_turn[i] / t.scored_by_turn[i]);
      }
      by_turn += (i ? " " : "") + std::string(cell);
    }
    char reused[32] = "-";
    if (t.tokens_reused > 0) {
      std::snprintf(reused, sizeof reused, "%.1f", 100.0 * t.tokens_reused / t.prompt_tokens);
    }
    std::printf("%-20s %-13s %-44s %5lld %6s %8s %6s %9.1f %7.1f %8.2f %8.2f %6s %9.0f %8s  %s\n",
                std::get<0>(key).c_str(), std::get<1>(key).c_str(), std::get<2>(key).c_str(),
                static_cast<long long>(t.turns), acc, kl, top1, t.ttft_ms / n,
                t.timed ? t.decode_tps / static_cast<double>(t.timed) : 0.0, mib(t.kv_bytes / n),
                mib(static_cast<double>(t.kv_peak)), ratio,
                t.timed ? t.kv_read / static_cast<double>(t.timed) / 1024.0 : 0.0, reused,
                by_turn.empty() ? "-" : by_turn.c_str());
  }
  std::fflush(stdout);
}

}  // namespace kvbench
