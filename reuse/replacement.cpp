#include "reuse/replacement.h"

#include <cassert>
#include <chrono>

#include "common/input_error.h"

namespace kvbench {

Replacement parse_replacement(const std::string& text) {
  if (text == "lru") return Replacement::Lru;
  if (text == "lfu") return Replacement::Lfu;
  if (text == "fifo") return Replacement::Fifo;
  if (text == "ttl") return Replacement::Ttl;
  throw InputError("replacement policy '" + text + "': expected lru, lfu, fifo or ttl");
}

const char* to_string(Replacement policy) {
  switch (policy) {
    case Replacement::Lru:
      return "lru";
    case Replacement::Lfu:
      return "lfu";
    case Replacement::Fifo:
      return "fifo";
    case Replacement::Ttl:
      return "ttl";
  }
  return "?";
}

double steady_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

ReplacementIndex::ReplacementIndex(Replacement policy, double ttl_s, SecondsClock clock,
                                   bool renew_on_touch)
    : policy_(policy),
      ttl_s_(ttl_s),
      renew_on_touch_(renew_on_touch),
      clock_(clock ? std::move(clock) : steady_seconds) {}

ReplacementIndex::Rank ReplacementIndex::rank_of(const Entry& entry) const {
  switch (policy_) {
    case Replacement::Lru:
      return {0.0, entry.last_tick};
    case Replacement::Lfu:
      return {static_cast<double>(entry.accesses), entry.last_tick};
    case Replacement::Fifo:
      return {0.0, entry.inserted_tick};
    case Replacement::Ttl:
      return {entry.expires_s, entry.last_tick};
  }
  return {0.0, entry.last_tick};
}

void ReplacementIndex::rerank(const std::string& key, Entry& entry) {
  order_.erase(entry.rank);
  entry.rank = rank_of(entry);
  order_.emplace(entry.rank, key);
}

void ReplacementIndex::insert(const std::string& key, int64_t bytes) {
  const double now = clock_();
  auto [it, fresh] = entries_.try_emplace(key);
  Entry& entry = it->second;
  if (!fresh) bytes_ -= entry.bytes;
  bytes_ += bytes;
  entry.bytes = bytes;
  entry.inserted_s = now;
  entry.last_access_s = now;
  entry.accesses += 1;
  entry.expires_s = now + ttl_s_;
  entry.inserted_tick = entry.last_tick = ++tick_;
  if (fresh) entry.rank = {-1.0, 0};  // not in order_ yet; erase of a missing rank is a no-op
  rerank(key, entry);
}

bool ReplacementIndex::touch(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end() || expired(key)) return false;
  Entry& entry = it->second;
  entry.last_access_s = clock_();
  if (renew_on_touch_) entry.expires_s = entry.last_access_s + ttl_s_;
  entry.accesses += 1;
  entry.last_tick = ++tick_;
  rerank(key, entry);
  return true;
}

void ReplacementIndex::erase(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  bytes_ -= it->second.bytes;
  order_.erase(it->second.rank);
  entries_.erase(it);
}

bool ReplacementIndex::expired(const std::string& key) const {
  if (policy_ != Replacement::Ttl) return false;
  auto it = entries_.find(key);
  return it != entries_.end() && clock_() >= it->second.expires_s;
}

std::vector<std::string> ReplacementIndex::expired_keys() const {
  std::vector<std::string> out;
  if (policy_ != Replacement::Ttl) return out;
  const double now = clock_();
  for (const auto& [rank, key] : order_) {  // by expiry: the first live one ends the run
    if (rank.first > now) break;
    out.push_back(key);
  }
  return out;
}

int64_t ReplacementIndex::bytes_of(const std::string& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second.bytes;
}

std::optional<std::string> ReplacementIndex::victim(const std::string& keep) const {
  for (const auto& [rank, key] : order_) {
    if (key != keep) return key;
  }
  return std::nullopt;
}

}  // namespace kvbench
