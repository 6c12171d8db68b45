// The cache a model's forward runs on, built by the driver from the model's shape and device:
// the model itself knows only KvCache and the store interface, no method.
#pragma once

#include "cache/kv_cache.h"
#include "harness/model/llama_model.h"

namespace kvbench {

struct ResolvedSpec;

// Throws InputError naming the method when `spec` cannot run on `device` (checked before a
// model loads, and by new_cache).
void check_runs_on(const ResolvedSpec& spec, ModelDevice device);

// An empty cache for `spec` where `model`'s forward can use it: host stores on the CPU; on a
// GPU device stores (dense or KIVI's), with an eviction method's or Quest's decisions made on
// host copies (methods/cuda/device_cache.h). Reuse across requests does not run on a GPU
// yet (InputError naming the method).
KvCache new_cache(const LlamaModel& model, const ResolvedSpec& spec);

// One untimed forward of a prefill chunk on a scratch full cache: a process's first forward
// pays for thread pools and buffers, which would otherwise land in the first timing (a
// sweep's first TTFT or shared prefill, a benchmark's first case).
void warm_up(const LlamaModel& model);

}  // namespace kvbench
