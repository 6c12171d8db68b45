// The 16- and 8-bit caches engines hold (fp16, bf16, fp8): every kept row rounded as it is
// stored, in the narrow store (cache/narrow_kv.h), read back converted.
#include <string>
#include <utility>
#include <vector>

#include "cache/narrow_kv.h"
#include "cache/registry.h"
#ifdef KVBENCH_WITH_CUDA
#include "methods/cuda/narrow_store.h"
#endif

namespace kvbench {

namespace {

MethodInfo narrow_method(const std::string& name, KvElement element, const std::string& summary,
                         const std::string& paper, std::vector<std::string> choices) {
  MethodInfo info;
  info.name = name;
  info.kind = MethodKind::Storage;
  info.stage = "2 storage (rounds each row as it is stored) + 3 (converts as it reads)";
  info.summary = summary;
  info.paper = paper;
  choices.push_back(
      "the context attends over the rounded rows, as llama.cpp's cache does (an engine's "
      "prefill may read the unrounded chunk)");
  info.choices = std::move(choices);
  info.context_reads_store = true;
  info.splits_heads = true;
  info.make_layers = [element](const MethodParams&, const KvShape& shape) {
    return make_narrow_layers(shape, element);
  };
#ifdef KVBENCH_WITH_CUDA
  info.make_device_layers = [element](const MethodParams&, const KvShape& shape) {
    return make_cuda_narrow_layers(shape, element);
  };
#endif
  return info;
}

}  // namespace

// Registered as `fp16`, `bf16` and `fp8` (methods/method_list.cpp).
MethodInfo fp16_method() {
  return narrow_method("fp16", KvElement::F16,
                       "every kept token's keys and values in IEEE fp16 (round to nearest "
                       "even): the 16-bit cache engines hold",
                       "- (the engines' default KV cache)", {});
}

MethodInfo bf16_method() {
  return narrow_method("bf16", KvElement::BF16,
                       "every kept token's keys and values in bf16 (round to nearest even): "
                       "the 16-bit cache engines hold for bf16 models, the report's reference",
                       "- (the engines' default KV cache)", {});
}

MethodInfo fp8_method() {
  return narrow_method(
      "fp8", KvElement::F8E4M3,
      "keys and values in fp8 e4m3 with an fp32 scale per token and KV head (max |x| / 448)",
      "- (engines' fp8 KV cache: vLLM --kv-cache-dtype fp8_e4m3)",
      {"the scale is per token and KV head, computed as the row is stored; vLLM scales per "
       "tensor (1.0 unless calibrated), so this is kinder to outliers",
       "out-of-range values saturate to +-448 (e4m3fn has no infinity)"});
}

}  // namespace kvbench
