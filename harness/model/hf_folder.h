// A Hugging Face model folder (config.json, model.safetensors or its shards with
// model.safetensors.index.json, tokenizer.json, tokenizer_config.json) read as the GGUF file
// llama.cpp's converter (convert_hf_to_gguf.py) would write from it, in memory: the same
// metadata keys, the same tensor names, llama's Q and K rows permuted as the converter
// permutes them, Llama 3's RoPE scaling as its rope_freqs tensor, the vocabulary padded to
// the embedding's rows. The weights stay in their bf16, fp16 or fp32 (the tensors point into
// the mapped shards), so the model loads them as it loads any GGUF: the CPU forward converts
// them to fp32 once.
#pragma once

#include <memory>
#include <string>

namespace kvbench {

class GgufFile;

// A directory holding config.json.
bool is_hf_folder(const std::string& path);

// Throws InputError naming the folder and the file: a missing or malformed file, an
// architecture, tokenizer component or RoPE scaling kvbench does not implement, a missing
// tensor, a wrong shape or dtype, a truncated shard (safetensors.h).
std::unique_ptr<GgufFile> read_hf_folder(const std::string& dir);

// A model as --model names it: a Hugging Face folder (read_hf_folder) or a GGUF file; a folder
// without config.json is one InputError naming it.
std::unique_ptr<GgufFile> open_model_file(const std::string& path);

}  // namespace kvbench
