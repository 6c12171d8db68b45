// How a method takes in the shared context. `prefill=dense` (the default) feeds all of it
// and the method compresses once it is in, as kvpress, SCBench and KVCache-Factory do.
// `prefill=stream,chunk=N` feeds it N tokens at a time with an eviction after each, so the
// cache never holds more than the budget plus one chunk: a lower peak, and what users of
// kvpress ask for. Methods that can evict during the prefill (StreamingLLM, KeyDiff) take
// these two parameters; every other method prefills dense.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/registry.h"

namespace kvbench {

// prefill (dense | stream) and chunk (tokens per streamed forward, at most kPrefillChunk,
// default kPrefillChunk; given only with prefill=stream).
std::vector<ParamInfo> prefill_params();
// InputError for prefill=stream with a ratio budget (a ratio resolves only once the whole
// context is in), and for a chunk without prefill=stream.
void check_prefill(const MethodParams& params);
// The streamed chunk, or 0 for a dense prefill: what TokenPolicy::context_block() returns.
int64_t stream_chunk(const MethodParams& params);

}  // namespace kvbench
