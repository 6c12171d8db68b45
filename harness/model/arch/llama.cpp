// Llama 2 and 3.x, Mistral 7B, SmolLM2 (llama.cpp's src/models/llama.cpp; transformers'
// LlamaForCausalLM, MistralForCausalLM): interleaved RoPE in the GGUF (llama.cpp's converter
// permutes Q and K; a Hugging Face folder is permuted the same way at load), no biases, no
// query or key norms. Llama 3.1's RoPE scaling arrives as rope_freqs.weight in a GGUF and as
// rope_scaling {"rope_type": "llama3"} in a folder; both are read by the shared loaders.
// Mistral's sliding window (v0.1's 4096) is refused: the layer loop attends to everything.
#include "harness/model/arch/architecture.h"

namespace kvbench {

extern const Architecture kLlama;
const Architecture kLlama = {
    "llama", {"LlamaForCausalLM", "MistralForCausalLM"}, RopeStyle::Interleaved,
    /*qkv_bias=*/false, /*qk_norm=*/false, /*sliding_window_flagged=*/false};

}  // namespace kvbench
