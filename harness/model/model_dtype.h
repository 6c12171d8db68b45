// The precision the model's forward pass runs in. fp32 everywhere (the default, and the
// fidelity reference) or, on a GPU, bf16 weights and activations with fp32 accumulation:
// the rule is written in harness/model/cuda_forward.h.
#pragma once

namespace kvbench {

enum class ModelDtype { Fp32, Bf16 };

inline const char* dtype_name(ModelDtype dtype) {
  return dtype == ModelDtype::Bf16 ? "bf16" : "fp32";
}

// How the CPU forward rounds the activations of its linear layers: exact fp32 (the
// default, and the fidelity reference: a token's logits are the same decoded or prefilled,
// up to fp32 summation order), or int8 per 32 values for integer dot products, as llama.cpp
// does (kernels/cpu/block_matvec_q8.h, gemm_q8.h): faster, logits moved by the rounding.
enum class Activations { Fp32, Int8 };

inline const char* activations_name(Activations a) {
  return a == Activations::Int8 ? "int8" : "fp32";
}

// The two kinds of product, each with its own setting: `decode` for few rows (a decode
// step, a decode batch, a prefill chunk of up to four tokens), read from the weights' own
// blocks; `prefill` for the GEMMs of longer prefill chunks.
struct CpuActivations {
  Activations decode = Activations::Fp32;
  Activations prefill = Activations::Fp32;
};

}  // namespace kvbench
