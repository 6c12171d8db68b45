// Qwen3 dense models (llama.cpp's src/models/qwen3.cpp; transformers' Qwen3ForCausalLM):
// NEOX RoPE, no biases, and each query and key head RMS-normalized over head_dim
// (self_attn.q_norm / k_norm, GGUF attn_q_norm / attn_k_norm) before RoPE. head_dim is its
// own config field (128 on every Qwen3, whatever hidden_size / num_attention_heads gives).
#include "harness/model/arch/architecture.h"

namespace kvbench {

extern const Architecture kQwen3;
const Architecture kQwen3 = {
    "qwen3", {"Qwen3ForCausalLM"}, RopeStyle::Neox,
    /*qkv_bias=*/false, /*qk_norm=*/true, /*sliding_window_flagged=*/true};

}  // namespace kvbench
