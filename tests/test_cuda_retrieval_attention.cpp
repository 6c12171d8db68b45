// retrieval_attention on --device cuda (cache/cuda/host_policies.h): the index and its
// choice stay on the host, attention reads the chosen token slots from the device stores
// (dense fp32, or KIVI's packed blocks), equal to the CPU cache's reads.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cache/registry.h"
#include "cuda_device.h"
#include "methods/cuda/device_cache.h"

using namespace kvbench;
using kvbench::testing::Device;
using kvbench::testing::require_device;

TEST_CASE("cuda retrieval_attention reads the CPU cache's tokens, alone and over kivi", "[gpu]") {
  require_device();
  const int32_t kv_heads = 2, group = 2, n_heads = kv_heads * group;
  const KvShape shape{2, kv_heads, 64};
  for (const std::string spec :
       {"retrieval_attention:top_k=32,n_clusters=8,nprobe=2,sink=4,recent=16",
        "retrieval_attention:top_k=32,n_clusters=8,nprobe=2,sink=4,recent=16+kivi:bits=4"}) {
    INFO(spec);
    const ResolvedSpec resolved = resolve_method_spec(spec);
    KvCache cpu = make_cache(resolved, shape);
    KvCache gpu = make_cuda_cache(resolved, shape);
    std::mt19937 rng(4);
    std::normal_distribution<float> dist(0.f, 1.f);
    const auto forward = [&](int64_t n, bool decode) {
      if (decode) {
        cpu.mark_decode_step();
        gpu.mark_decode_step();
      }
      std::vector<int32_t> positions(static_cast<size_t>(n));
      std::iota(positions.begin(), positions.end(), cpu.next_position());
      const Device<int32_t> dpositions(positions);
      const float scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
      const int32_t n_queries = static_cast<int32_t>(n);
      for (int32_t l = 0; l < shape.n_layers; ++l) {
        std::vector<float> k(n * kv_heads * shape.head_dim), v(k.size());
        std::vector<float> q(n * n_heads * shape.head_dim), cpu_out(q.size(), 0.0f);
        for (auto* x : {&k, &v, &q}) {
          for (float& f : *x) f = dist(rng);
        }
        const Device<float> dk(k), dv(v), dq(q), dout(cpu_out);
        cpu.append(l, k.data(), v.data(), positions.data(), n);
        gpu.append(l, dk.get(), dv.get(), dpositions.get(), n);
        cpu.attend(l, AttentionQuery{q.data(), positions.data(), cpu_out.data(), n_queries, n_heads,
                                     scale});
        gpu.attend(
            l, AttentionQuery{dq.get(), dpositions.get(), dout.get(), n_queries, n_heads, scale});
        const std::vector<float> gpu_out = dout.host();
        float max_diff = 0.0f;
        for (size_t i = 0; i < q.size(); ++i) {
          max_diff = std::max(max_diff, std::abs(gpu_out[i] - cpu_out[i]));
        }
        CHECK(max_diff < 1e-4f);
      }
      cpu.advance(n_queries);
      gpu.advance(n_queries);
    };
    forward(300, false);
    cpu.end_context();
    gpu.end_context();
    for (int step = 0; step < 4; ++step) {
      forward(1, true);
      CHECK(gpu.stats().bytes_read_last_forward == cpu.stats().bytes_read_last_forward);
    }
    // The steps read fewer tokens than stored, and the recall is the host reader's.
    const ReadPolicy::Recall a = cpu.reader()->recall(), b = gpu.reader()->recall();
    CHECK(a.count == 4 * shape.n_layers * n_heads);
    CHECK(b.count == a.count);
    CHECK(b.sum == a.sum);
    CHECK(a.sum < a.count);
  }
}
