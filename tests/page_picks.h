// Page selections for tests of the page-reading kernels (Quest), CPU and CUDA alike.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace kvbench::testing {

inline int64_t pages_of(int64_t n_tokens, int page_tokens) {
  return (n_tokens + page_tokens - 1) / page_tokens;
}

// Which pages each KV head reads, [n_kv_heads, n_selected], ascending per head.
enum class Pick { Last, All, Random, Alternate };

inline std::vector<int32_t> pick_pages(Pick pick, int n_kv_heads, int64_t n_pages, uint32_t seed,
                                       int& n_selected) {
  std::mt19937 rng(seed);
  std::vector<int32_t> out;
  switch (pick) {
    case Pick::Last:  // one page: the last, often partial
      n_selected = 1;
      out.assign(n_kv_heads, static_cast<int32_t>(n_pages - 1));
      return out;
    case Pick::All:
      n_selected = static_cast<int>(n_pages);
      for (int h = 0; h < n_kv_heads; ++h) {
        for (int32_t p = 0; p < n_pages; ++p) out.push_back(p);
      }
      return out;
    case Pick::Alternate:  // no two selected pages adjacent, the last one included
      n_selected = static_cast<int>((n_pages + 1) / 2);
      for (int h = 0; h < n_kv_heads; ++h) {
        for (int i = n_selected - 1; i >= 0; --i)
          out.push_back(static_cast<int32_t>(n_pages - 1 - 2 * i));
      }
      return out;
    case Pick::Random:  // a different quarter-ish of the pages per head, the last forced in
      n_selected = static_cast<int>(std::max<int64_t>(1, n_pages / 4 + 1));
      for (int h = 0; h < n_kv_heads; ++h) {
        std::vector<int32_t> all(n_pages - 1);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(n_selected - 1);
        all.push_back(static_cast<int32_t>(n_pages - 1));
        std::sort(all.begin(), all.end());
        out.insert(out.end(), all.begin(), all.end());
      }
      return out;
  }
  return out;
}

}  // namespace kvbench::testing
