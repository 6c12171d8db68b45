// Two runs of a session that must agree bit for bit: predictions, logits, fidelity, bytes.
#pragma once

#include <catch2/catch.hpp>

#include "harness/session.h"

namespace kvbench::testing {

inline void require_same_turns(const SessionResult& a, const SessionResult& b) {
  REQUIRE(a.turns.size() == b.turns.size());
  for (size_t t = 0; t < a.turns.size(); ++t) {
    INFO("turn " << t + 1);
    const TurnRecord& x = a.turns[t];
    const TurnRecord& y = b.turns[t];
    CHECK(x.prediction == y.prediction);
    CHECK(x.own.first_logprobs == y.own.first_logprobs);
    CHECK(x.own.top1 == y.own.top1);
    CHECK(x.first_token_kl == y.first_token_kl);
    CHECK(x.top1_agreement == y.top1_agreement);
    CHECK(x.kv_bytes == y.kv_bytes);
    CHECK(x.kv_bytes_peak == y.kv_bytes_peak);
    CHECK(x.tokens_kept == y.tokens_kept);
    CHECK(x.kv_read_per_step == y.kv_read_per_step);
    CHECK(x.cache.tokens_evicted == y.cache.tokens_evicted);
    CHECK(x.cache.bytes_read_total == y.cache.bytes_read_total);
    CHECK(x.cache.bytes_per_layer == y.cache.bytes_per_layer);
  }
}

}  // namespace kvbench::testing
