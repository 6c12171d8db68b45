#include "methods/prefill_mode.h"

#include <string>

#include "harness/input_error.h"
#include "methods/policy.h"

namespace kvbench {

std::vector<ParamInfo> prefill_params() {
  return {
      choice_param("prefill", "dense", {"dense", "stream"},
                   "dense: compress once the whole context is in; stream: evict after every "
                   "`chunk` context tokens (a lower peak)"),
      int_param("chunk", kPrefillChunk, 1, static_cast<double>(kPrefillChunk),
                "context tokens per forward under prefill=stream"),
  };
}

void check_prefill(const MethodParams& params) {
  if (params.get("prefill") == "stream" && params.has("ratio")) {
    throw InputError("prefill=stream needs a token budget: ratio=" + params.get("ratio") +
                     " resolves only once the whole context is in");
  }
}

int64_t stream_chunk(const MethodParams& params) {
  return params.get("prefill") == "stream" ? params.get_int("chunk") : 0;
}

}  // namespace kvbench
