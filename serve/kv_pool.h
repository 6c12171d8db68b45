// The serving engine's KV memory pool: a fixed number of bytes that the running sequences'
// caches share. It is a budget over the bytes the stores really hold (LayerKv::bytes_resident,
// measured every step), not an arena: each store allocates its own rows, so a method that
// holds fewer bytes (a 1/4 budget, a 4-bit store) leaves room for more sequences.
//
// A sequence reserves, before its prompt is in, a bound on what its store will hold: the
// prompt at the store's prefill-time bytes per token (fp32 for a store that packs only at
// the context's end), or, where the prompt's chunks settle as they come in
// (KvCache::settle_context_chunks: KIVI packs each chunk's whole blocks), what the packed
// chunks and the chunk in flight hold; then room for the answer. Once its context is
// compressed it reserves what the compressed cache holds and the answer's room: allocated up
// front where that is what the store holds least under (a dense store: one allocation
// instead of growing by half), else a bound on the store's measured growth. Its reservation
// never falls below the bytes its stores hold. A request is admitted only when its
// reservation fits beside the others'.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace kvbench {

class LlamaModel;
struct ResolvedSpec;

// A bound on the bytes a store holds for `tokens` tokens: fixed + per_token x tokens.
struct ByteBound {
  int64_t fixed = 0;
  double per_token = 0;
  int64_t at(int64_t tokens) const;
};

// What tokens cost in a store, measured (KvPool::store_cost).
struct StoreCost {
  // The prompt held whole at prefill precision until end_context: bytes per prompt token.
  double prompt_token_bytes = 0;
  // Then the answer's room beyond the compressed prompt: allocated up front
  // (KvCache::reserve_more), or else a bound on the growth over any prefix of the answer.
  bool reserve_answer = true;
  ByteBound answer;
  // A store whose prompt chunks can settle (KvCache::settle_context_chunks), its packed room
  // reserved at admission for the prompt and the answer: a bound on what it holds over the
  // whole sequence, in prompt + answer tokens, and on what the answer adds beyond the
  // compressed prompt (the fp32 tail's comings and goings).
  bool settles_chunks = false;
  ByteBound whole;
  ByteBound packed_answer;
};

class KvPool {
 public:
  // prefill_chunk: the prompt tokens one engine iteration feeds (a settling prompt's bound).
  KvPool(int64_t capacity, int64_t prefill_chunk)
      : capacity_(capacity), prefill_chunk_(prefill_chunk) {}
  int64_t capacity() const { return capacity_; }
  // `spec`'s store measured once on caches of its storage component alone (no policy): 256
  // context tokens, end_context, then 256 decoded tokens one at a time with the answer's
  // room allocated up front and without; where chunks settle, also whole sequences of 2 to
  // 16 prompt chunks and 64 answer tokens. Remembered by the storage component's canonical
  // spec. Any thread.
  StoreCost store_cost(const LlamaModel& model, const ResolvedSpec& spec);

 private:
  int64_t capacity_;
  int64_t prefill_chunk_;
  std::mutex mutex_;
  std::map<std::string, StoreCost> costs_;
};

}  // namespace kvbench
