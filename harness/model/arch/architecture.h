// What sets one transformer architecture apart from the others kvbench runs: its names, how
// its attention rotates and normalizes queries and keys, which biases its projections carry,
// and how its Hugging Face config is read. The layer loop (llama_model.cpp, cuda_forward.cpp)
// and both loaders (model_config.cpp for a GGUF, hf_folder.cpp for a Hugging Face folder)
// read only this struct, never an architecture's name; one file under arch/ fills it in for
// each architecture (docs/models.md, "Add a model"). What every architecture here shares:
// pre-norm blocks with RMSNorm, rotary positions, grouped-query attention, a SwiGLU MLP.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace kvbench {

enum class RopeStyle {
  Interleaved,  // rotates the pairs (2i, 2i+1): llama.cpp's LLAMA_ROPE_TYPE_NORM
  Neox,         // rotates (i, i + head_dim/2): LLAMA_ROPE_TYPE_NEOX (GPT-NeoX, the Qwens)
};

struct Architecture {
  std::string_view name;                     // general.architecture: llama.cpp's name
  // config.json "architectures" entries it is read from (unused slots empty). Literal types
  // only, so that each architecture is constant-initialized, before any code runs.
  std::array<std::string_view, 4> hf_classes;
  // As the GGUF holds Q and K rows. transformers' checkpoints always hold NEOX's half-split
  // order, so a folder of an Interleaved architecture is permuted as llama.cpp's converter
  // does; the loader then permutes every Neox model into interleaved rows, so that every
  // kernel sees one layout.
  RopeStyle rope = RopeStyle::Interleaved;
  // The Q, K and V projections carry biases. A GGUF's biases are read wherever present; a
  // Hugging Face folder holds them exactly when this is set.
  bool qkv_bias = false;
  // Each query and key head RMS-normalized over head_dim by weights of its own, before RoPE.
  bool qk_norm = false;
  // config.json's sliding_window is honoured only with "use_sliding_window": true (Qwen2 and
  // Qwen3 write a window they do not use); unset, any window there is refused, since no
  // architecture here implements sliding-window layers.
  bool sliding_window_flagged = false;
};

// The architectures kvbench runs, in the order messages list them.
const std::vector<const Architecture*>& architectures();
// nullptr when no architecture is called `name` / is read from `hf_class`.
const Architecture* find_architecture(std::string_view name);
const Architecture* find_hf_architecture(std::string_view hf_class);
// "llama, qwen2, qwen3", for error messages.
std::string architecture_names();
std::string hf_class_names();

}  // namespace kvbench
