// Writes small GGUF files for tests: any metadata, tensors quantized the way ggml's
// quantize_row_*_ref does it, and a tiny random-weight llama model with a byte-level
// BPE tokenizer laid out like a real llama.cpp conversion.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "harness/model/gguf.h"

namespace kvbench::testing {

// Metadata value builders; the reader gives back exactly these values.
GgufValue gguf_u8(uint8_t v);
GgufValue gguf_i8(int8_t v);
GgufValue gguf_u16(uint16_t v);
GgufValue gguf_i16(int16_t v);
GgufValue gguf_u32(uint32_t v);
GgufValue gguf_i32(int32_t v);
GgufValue gguf_u64(uint64_t v);
GgufValue gguf_i64(int64_t v);
GgufValue gguf_f32(float v);
GgufValue gguf_f64(double v);
GgufValue gguf_bool(bool v);
GgufValue gguf_str(const std::string& v);
// Arrays: `elem` names the stored element type (e.g. UINT16 for a vector of uint64 values).
GgufValue gguf_array(GgufValueType elem, std::vector<uint64_t> v);
GgufValue gguf_array(GgufValueType elem, std::vector<int64_t> v);
GgufValue gguf_array(GgufValueType elem, std::vector<double> v);
GgufValue gguf_array(std::vector<bool> v);
GgufValue gguf_array(std::vector<std::string> v);

// Quantizes n floats (a multiple of the block size) with ggml's reference rules. Supports
// F32, F16, BF16, Q8_0, Q4_0 and Q4_1.
std::vector<uint8_t> quantize(GgmlType type, const float* x, int64_t n);

class GgufWriter {
 public:
  // A non-default alignment is also written as general.alignment (uint32), first key.
  explicit GgufWriter(uint32_t version = 3, uint32_t alignment = 32);

  void add(const std::string& key, const GgufValue& value);
  // Writes the key, the type tag and `payload` verbatim: nested arrays or hostile values.
  void add_raw(const std::string& key, GgufValueType type, std::vector<uint8_t> payload);

  // shape in ggml order (shape[0] is the row length).
  void add_tensor(const std::string& name, std::vector<int64_t> shape, GgmlType type,
                  const std::vector<float>& values);
  void add_tensor_bytes(const std::string& name, std::vector<int64_t> shape, GgmlType type,
                        std::vector<uint8_t> bytes);

  std::vector<uint8_t> bytes() const;
  void write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    GgmlType type;
    std::vector<uint8_t> data;
  };
  uint32_t version_;
  uint32_t alignment_;
  std::vector<std::vector<uint8_t>> kv_;  // each an encoded key, type and value
  std::vector<Tensor> tensors_;
};

void write_file(const std::string& path, const std::vector<uint8_t>& bytes);
std::vector<uint8_t> read_file_bytes(const std::string& path);
// A fresh path under a per-process temporary directory.
std::string temp_path(const std::string& file_name);

// A valid GGUF v3 file of a few hundred bytes: one key of every scalar type, a string array,
// and an F32 and a Q8_0 tensor. Tests truncate and corrupt it.
std::vector<uint8_t> small_gguf_bytes();

struct TinyLlamaSpec {
  int n_layer = 2;
  int n_embd = 64;
  int n_head = 4;
  int n_head_kv = 2;
  int n_ff = 128;
  int context_length = 256;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  uint32_t seed = 1;
  GgmlType weight_type = GgmlType::Q8_0;  // the 2-D matrices; norms and biases are F32
  bool tied_embeddings = true;            // no output.weight when tied
  // An untied output.weight's standard deviation: larger values give peaked logits, so that
  // greedy tokens do not hinge on rounding (the CPU-vs-GPU tests of a random model).
  float output_std = 0.05f;
  float weight_std = 0.05f;  // every other weight matrix's standard deviation
  // Tokens past the tiny vocabulary, "<|unused_N|>" (never produced by the tokenizer), up to
  // this many in all: a real model's embedding and LM-head sizes. 0: the tiny vocabulary.
  int vocab_size = 0;
  bool qkv_bias = false;  // blk.N.attn_{q,k,v}.bias
  // Llama 3 rope scaling as llama.cpp converts it: a rope_freqs.weight tensor of
  // per-dimension frequency divisors, computed from these parameters.
  bool llama3_rope_scaling = false;
  float rope_scaling_factor = 8.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int rope_original_context_length = 8192;
};

// The tokenizer: ids 0..2 are <|endoftext|>, <|im_start|>, <|im_end|>; ids 3..258 the byte
// tokens in byte order; then the merged tokens of tiny_llama_merges(), in order.
std::vector<std::string> tiny_llama_tokens();
std::vector<std::string> tiny_llama_merges();
constexpr int kTinyLlamaByteTokenBase = 3;

void write_tiny_llama_gguf(const std::string& path, const TinyLlamaSpec& spec = TinyLlamaSpec());

// SmolLM2-135M's shape (30 layers, 576 wide, 9 query and 3 KV heads of 64, FFN 1536, vocab
// 49152, theta 1e5) with random Q8_0 weights and `context_length` positions: a real-size model
// for the GPU tests and benchmarks, written by kvbench itself, so they need no download.
TinyLlamaSpec smollm2_135m_shape(int context_length = 8192);

// A random SmolLM2-shaped GGUF, written once into the temporary directory and shared by
// later processes (written to a side file, then renamed; the name's version changes with
// smollm2_135m_shape's weights); `n_layer` other than 30 writes that many layers of its shape.
std::string random_smollm2_gguf(int context_length = 8192, int n_layer = 30);

}  // namespace kvbench::testing
