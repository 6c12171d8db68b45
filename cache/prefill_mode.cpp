#include "cache/prefill_mode.h"

#include <string>

#include "cache/policy.h"
#include "common/input_error.h"

namespace kvbench {

namespace {

ParamInfo chunk_param() {
  ParamInfo chunk = int_param("chunk", kPrefillChunk, 1, static_cast<double>(kPrefillChunk),
                              "context tokens per forward under prefill=stream (default 512)");
  chunk.default_value = "";  // only a streamed prefill has one
  return chunk;
}

}  // namespace

std::vector<ParamInfo> prefill_params() {
  return {
      choice_param("prefill", "dense", {"dense", "stream"},
                   "dense: compress once the whole context is in; stream: evict after every "
                   "`chunk` context tokens (a lower peak)"),
      chunk_param(),
  };
}

void check_prefill(const MethodParams& params) {
  if (params.get("prefill") != "stream") {
    if (params.has("chunk")) {
      throw InputError("chunk=" + params.get("chunk") + " applies to prefill=stream only");
    }
    return;
  }
  if (params.has("ratio")) {
    throw InputError("prefill=stream needs a token budget: ratio=" + params.get("ratio") +
                     " resolves only once the whole context is in");
  }
}

int64_t stream_chunk(const MethodParams& params) {
  if (params.get("prefill") != "stream") return 0;
  return params.has("chunk") ? params.get_int("chunk") : kPrefillChunk;
}

}  // namespace kvbench
