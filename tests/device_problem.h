// An AttentionProblem (attention_problem.h) copied to the device for the CUDA kernel tests:
// kv and query point at device copies, and the output starts as 123s (a row a kernel skips
// shows), brought back by out.host().
#pragma once

#include <vector>

#include "attention_problem.h"
#include "cuda_device.h"

namespace kvbench::testing {

struct DeviceProblem {
  explicit DeviceProblem(const AttentionProblem& p)
      : k(p.k),
        v(p.v),
        q(p.q),
        out(std::vector<float>(p.q.size(), 123.0f)),
        positions(p.positions),
        q_positions(p.q_positions),
        kv(p.kv),
        query(p.query) {
    kv.k = k.get();
    kv.v = v.get();
    kv.positions = positions.get();
    query.q = q.get();
    query.q_positions = q_positions.get();
    query.out = out.get();
  }

  Device<float> k, v, q, out;
  Device<int32_t> positions, q_positions;
  DenseKv kv;
  AttentionQuery query;
};

}  // namespace kvbench::testing
