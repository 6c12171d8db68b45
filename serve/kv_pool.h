// The serving engine's KV memory pool: a fixed number of bytes that the running sequences'
// caches share. It is a budget over the bytes the stores really hold (LayerKv::bytes_resident,
// measured every step), not an arena: each store allocates its own rows, so a method that
// holds fewer bytes (a 1/4 budget, a 4-bit store) leaves room for more sequences.
//
// A sequence reserves, before its prompt is in, the prompt and its answer at its store's
// prefill-time bytes per token (the store as it holds a context before end_context: fp32 for
// KIVI, whose prompt is packed only then). Once its context is compressed it reserves what
// the compressed cache holds and room for the answer: allocated up front where that is what
// the store holds least under (a dense store: one allocation instead of growing by half),
// else the store's measured growth per decoded token (KIVI packs as it goes). Its
// reservation never falls below the bytes its stores hold. A request is admitted only when
// its reservation fits beside the others'.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace kvbench {

class LlamaModel;
struct ResolvedSpec;

// What one more token costs in a store, measured (KvPool::store_cost).
struct StoreCost {
  int64_t prefill_token_bytes = 0;  // while a context comes in, before end_context
  // The answer's room: allocated up front (KvCache::reserve_more), or else this many bytes
  // a decoded token at most, over any prefix of 256 decoded tokens.
  bool reserve_answer = true;
  int64_t decode_token_bytes = 0;
};

class KvPool {
 public:
  explicit KvPool(int64_t capacity) : capacity_(capacity) {}
  int64_t capacity() const { return capacity_; }
  // `spec`'s store measured once on a cache of its storage component alone (no policy): 256
  // context tokens, end_context, then 256 decoded tokens one at a time with the answer's
  // room allocated up front and without; remembered by the storage component's canonical
  // spec. Any thread.
  StoreCost store_cost(const LlamaModel& model, const ResolvedSpec& spec);

 private:
  int64_t capacity_;
  std::mutex mutex_;
  std::map<std::string, StoreCost> costs_;
};

}  // namespace kvbench
