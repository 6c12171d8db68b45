// The precision the model's forward pass runs in. fp32 everywhere (the default, and the
// fidelity reference) or, on a GPU, bf16 weights and activations with fp32 accumulation:
// the rule is written in harness/model/cuda_forward.h.
#pragma once

namespace kvbench {

enum class ModelDtype { Fp32, Bf16 };

inline const char* dtype_name(ModelDtype dtype) {
  return dtype == ModelDtype::Bf16 ? "bf16" : "fp32";
}

// The activations of the CPU's few-row products (decode, and prefill chunks of up to four
// tokens): exact fp32 (the default: a token's logits are the same decoded or prefilled,
// up to fp32 summation order), or rounded to int8 per 32 values for integer dot products,
// as llama.cpp does (kernels/cpu/block_matvec_q8.h): faster decode, logits moved by the
// rounding.
enum class DecodeActivations { Fp32, Int8 };

inline const char* decode_activations_name(DecodeActivations a) {
  return a == DecodeActivations::Int8 ? "int8" : "fp32";
}

}  // namespace kvbench
