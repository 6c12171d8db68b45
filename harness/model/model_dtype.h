// The precision the model's forward pass runs in. fp32 everywhere (the default, and the
// fidelity reference) or, on a GPU, bf16 weights and activations with fp32 accumulation:
// the rule is written in harness/model/cuda_forward.h.
#pragma once

namespace kvbench {

enum class ModelDtype { Fp32, Bf16 };

inline const char* dtype_name(ModelDtype dtype) {
  return dtype == ModelDtype::Bf16 ? "bf16" : "fp32";
}

}  // namespace kvbench
