#include "methods/cuda/device_cache.h"

#include "cache/cuda/dense_store.h"
#include "cache/cuda/host_policies.h"
#include "cache/cuda/row_memory.h"
#include "cache/head_split.h"
#include "common/input_error.h"
#include "methods/cuda/sparse_prefill.h"
#include "methods/sparse_prefill.h"

namespace kvbench {

KvCache make_cuda_cache(const ResolvedSpec& spec, const KvShape& shape) {
  CacheParts parts = make_cache_parts(spec, shape);
  std::vector<std::unique_ptr<LayerKv>> layers = make_cuda_dense_layers(shape);
  bool ragged = false;  // then a storage method's stores hold their heads apart, as on the host
  for (const auto& component : spec.components) {
    ragged = ragged || makes_ragged_heads(*component.first);
  }
  for (const auto& [info, params] : spec.components) {
    if (info->kind != MethodKind::Storage) continue;
    if (!info->make_device_layers) {
      throw InputError("method '" + info->name + "' does not run on --device cuda yet");
    }
    layers = info->make_device_layers(params, shape);
    if (ragged) {  // the dense device store holds them itself
      layers = split_heads_on_ragged_plans(std::move(layers), shape.n_kv_heads, shape.head_dim,
                                           device_memory());
    }
  }
  std::unique_ptr<TokenPolicy> policy;
  if (parts.policy && ragged && parts.policy->reads_ragged_heads()) {
    // Its plans after the first would read device layers whose heads are stored apart,
    // which the host wrapping does not gather.
    throw InputError("'" + spec.canonical + "': a policy that plans again after a ragged plan "
                     "(reads_ragged_heads) under an allocation method runs with --device cpu only");
  }
  if (parts.policy) policy = std::make_unique<HostPolicyOnDevice>(std::move(parts.policy));
  std::unique_ptr<ReadPolicy> reader;
  if (parts.reader) {
    reader = std::make_unique<HostReaderOnDevice>(std::move(parts.reader), shape.n_kv_heads,
                                                  shape.head_dim);
  }
  KvCache cache(shape, std::move(layers), std::move(policy), std::move(reader));
  // A sparse prefill attends on the device (its pattern chosen on the host).
  if (parts.prefill) {
    const auto* sparse = dynamic_cast<const SparsePrefill*>(parts.prefill.get());
    if (sparse == nullptr) throw InputError("a prefill method does not run on --device cuda yet");
    cache.set_prefill_attention(std::make_shared<const SparsePrefillOnDevice>(sparse->rule()));
  }
  return cache;
}

}  // namespace kvbench
