#include "harness/model_cache.h"

#include <vector>

#include "cache/full_cache.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "harness/model/tokenizer.h"
#ifdef KVBENCH_WITH_CUDA
#include "methods/cuda/device_cache.h"
#endif

namespace kvbench {

void check_runs_on(const ResolvedSpec& spec, ModelDevice device) {
  if (device != ModelDevice::Cuda) return;
  // On a GPU the KV lives in device stores (dense, narrow or KIVI's; heads of their own in
  // each, as on the host); policies and read policies plan on host copies
  // (methods/cuda/device_cache.h). Reuse keeps host memory.
  for (const auto& [info, params] : spec.components) {
    if (runs_on_cuda(*info)) continue;
    throw InputError("method '" + info->name + "' in '" + spec.canonical +
                     "' does not run on --device cuda yet: " +
                     (info->propagates_tokens
                          ? "its token-selective propagation runs in the CPU forward only"
                      : info->kind == MethodKind::Storage
                          ? "its store has no device twin (kivi, fp16, bf16 and fp8 do)"
                          : "the full cache, eviction methods, quest and kivi do"));
  }
}

KvCache new_cache(const LlamaModel& model, const ResolvedSpec& spec) {
  check_runs_on(spec, model.device());
  if (model.device() == ModelDevice::Cpu) return make_cache(spec, model.kv_shape());
#ifdef KVBENCH_WITH_CUDA
  return make_cuda_cache(spec, model.kv_shape());
#else
  throw InputError("--device cuda: this kvbench was built without CUDA");
#endif
}

void warm_up(const LlamaModel& model) {
  KvCache scratch = make_full_cache(model.kv_shape());
  model.forward(std::vector<int32_t>(static_cast<size_t>(model.prefill_chunk),
                                     model.tokenizer().eos_id()),
                scratch);
}

}  // namespace kvbench
