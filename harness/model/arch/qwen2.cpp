// Qwen2 and Qwen2.5 (llama.cpp's src/models/qwen2.cpp; transformers' Qwen2ForCausalLM): NEOX
// RoPE, biases on the Q, K and V projections (not on the output projection or the MLP).
// Its config.json names a sliding_window that applies only with use_sliding_window.
#include "harness/model/arch/architecture.h"

namespace kvbench {

extern const Architecture kQwen2;
const Architecture kQwen2 = {
    "qwen2", {"Qwen2ForCausalLM"}, RopeStyle::Neox,
    /*qkv_bias=*/true, /*qk_norm=*/false, /*sliding_window_flagged=*/true};

}  // namespace kvbench
