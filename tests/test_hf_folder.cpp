// Hugging Face model folders (harness/model/hf_folder.h): a tiny random llama written both as
// a GGUF and as the folder transformers would save of it (Q and K rows in Hugging Face's
// rotate-half order, the tokenizer as tokenizer.json) loads into the same model, bit for bit;
// and every malformed folder, shard or tokenizer is one InputError naming the file.
#include <catch2/catch.hpp>

#include <cstring>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/input_error.h"
#include "common/sha256.h"
#include "gguf_writer.h"
#include "harness/model/gguf.h"
#include "harness/model/hf_folder.h"
#include "harness/model/llama_model.h"
#include "harness/model/safetensors.h"
#include "harness/model/tokenizer.h"
#include "cache/full_cache.h"
#include "cache/registry.h"
#include "harness/model_cache.h"
#ifdef KVBENCH_WITH_CUDA
#include "harness/model/cuda_forward.h"
#endif

using namespace kvbench;
using nlohmann::json;

namespace {

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;  // outermost first
  std::vector<float> values;
};

// A safetensors file of F32 tensors; `header_edit` may change the header before it is written.
void write_safetensors(const std::string& path, const std::vector<Tensor>& tensors,
                       const std::function<void(json&)>& header_edit = nullptr) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::vector<uint8_t> data;
  for (const Tensor& t : tensors) {
    const size_t begin = data.size();
    data.resize(begin + t.values.size() * 4);
    std::memcpy(data.data() + begin, t.values.data(), t.values.size() * 4);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  if (header_edit) header_edit(header);
  const std::string text = header.dump();
  std::vector<uint8_t> bytes(8);
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(n >> (8 * i));
  bytes.insert(bytes.end(), text.begin(), text.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  testing::write_file(path, bytes);
}

void write_json(const std::string& path, const json& j) {
  const std::string text = j.dump(1);
  testing::write_file(path, std::vector<uint8_t>(text.begin(), text.end()));
}

std::vector<float> floats_of(const GgufTensorInfo& t) {
  REQUIRE(t.type == GgmlType::F32);
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

// GGUF's interleaved RoPE rows back to Hugging Face's rotate-half order: HF row h d + j d/2 + i
// is GGUF row h d + 2 i + j (the inverse of the converter's permute).
std::vector<float> unpermute(const std::vector<float>& rows, int64_t heads, int64_t cols) {
  const int64_t d = static_cast<int64_t>(rows.size()) / cols / heads, half = d / 2;
  std::vector<float> out(rows.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        std::memcpy(out.data() + (h * d + j * half + i) * cols,
                    rows.data() + (h * d + 2 * i + j) * cols, cols * 4);
      }
    }
  }
  return out;
}

struct Folder {
  std::string gguf, dir;
  json config, tokenizer, tokenizer_config;
  std::vector<Tensor> tensors;
  void write() const {
    write_json(dir + "/config.json", config);
    write_json(dir + "/tokenizer.json", tokenizer);
    write_json(dir + "/tokenizer_config.json", tokenizer_config);
    write_safetensors(dir + "/model.safetensors", tensors);
  }
};

// The tiny llama as a GGUF and as its Hugging Face folder (written by the test: the parts
// transformers' save_pretrained writes, in its layout).
Folder tiny_folder(const std::string& name) {
  testing::TinyLlamaSpec spec;
  spec.weight_type = GgmlType::F32;
  Folder f;
  f.gguf = testing::temp_path(name + ".gguf");
  testing::write_tiny_llama_gguf(f.gguf, spec);
  f.dir = testing::temp_path(name);
  std::filesystem::create_directories(f.dir);
  const GgufFile g(f.gguf);
  const int64_t vocab = g.get_int("llama.vocab_size");
  f.config = {{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"hidden_size", spec.n_embd},
              {"intermediate_size", spec.n_ff},
              {"num_attention_heads", spec.n_head},
              {"num_key_value_heads", spec.n_head_kv},
              {"num_hidden_layers", spec.n_layer},
              {"max_position_embeddings", spec.context_length},
              {"rms_norm_eps", spec.rms_eps},
              {"rope_theta", spec.rope_theta},
              {"vocab_size", vocab},
              {"tie_word_embeddings", true},
              {"torch_dtype", "float32"}};
  const std::vector<std::string> tokens = g.get_string_array("tokenizer.ggml.tokens");
  const std::vector<int64_t> types = g.get_int_array("tokenizer.ggml.token_type");
  json vocab_json = json::object(), added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] == static_cast<int64_t>(TokenType::CONTROL)) {
      added.push_back({{"id", i}, {"content", tokens[i]}, {"special", true}});
    }
    vocab_json[tokens[i]] = i;
  }
  f.tokenizer = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Digits"}, {"individual_digits", true}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
           {"use_regex", true}}}}}},
      {"model",
       {{"type", "BPE"}, {"vocab", vocab_json}, {"merges", g.get_string_array("tokenizer.ggml.merges")}}}};
  f.tokenizer_config = {{"bos_token", tokens[1]},
                        {"eos_token", tokens[2]},
                        {"add_bos_token", false},
                        {"chat_template", g.get_string("tokenizer.chat_template")}};
  const auto add = [&](const std::string& hf, const std::string& gguf_name, int64_t heads = 0) {
    const GgufTensorInfo& t = g.tensor(gguf_name);
    std::vector<int64_t> shape(t.shape.rbegin(), t.shape.rend());
    std::vector<float> values = floats_of(t);
    if (heads > 0) values = unpermute(values, heads, shape[1]);
    f.tensors.push_back({hf, shape, values});
  };
  add("model.embed_tokens.weight", "token_embd.weight");
  add("model.norm.weight", "output_norm.weight");
  for (int l = 0; l < spec.n_layer; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".";
    const std::string b = "blk." + std::to_string(l) + ".";
    add(h + "input_layernorm.weight", b + "attn_norm.weight");
    add(h + "post_attention_layernorm.weight", b + "ffn_norm.weight");
    add(h + "self_attn.q_proj.weight", b + "attn_q.weight", spec.n_head);
    add(h + "self_attn.k_proj.weight", b + "attn_k.weight", spec.n_head_kv);
    add(h + "self_attn.v_proj.weight", b + "attn_v.weight");
    add(h + "self_attn.o_proj.weight", b + "attn_output.weight");
    add(h + "mlp.gate_proj.weight", b + "ffn_gate.weight");
    add(h + "mlp.up_proj.weight", b + "ffn_up.weight");
    add(h + "mlp.down_proj.weight", b + "ffn_down.weight");
  }
  f.write();
  return f;
}

// The InputError read_hf_folder throws for `f` as written, which must name `file`.
std::string load_error(const Folder& f, const std::string& file) {
  try {
    read_hf_folder(f.dir);
  } catch (const InputError& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.find(f.dir + "/" + file) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
    return message;
  }
  FAIL("read_hf_folder accepted a bad folder");
  return "";
}

}  // namespace

TEST_CASE("hf folder: the same model as its GGUF, bit for bit", "[unit]") {
  const Folder f = tiny_folder("hf_same");
  REQUIRE(is_hf_folder(f.dir));
  REQUIRE_FALSE(is_hf_folder(f.gguf));
  const auto from_gguf = LlamaModel::load(f.gguf);
  const auto from_folder = LlamaModel::load(f.dir);
  const ModelConfig& a = from_gguf->config();
  const ModelConfig& b = from_folder->config();
  CHECK(b.arch->name == "llama");
  CHECK(b.n_layers == a.n_layers);
  CHECK(b.n_heads == a.n_heads);
  CHECK(b.n_kv_heads == a.n_kv_heads);
  CHECK(b.head_dim == a.head_dim);
  CHECK(b.vocab_size == a.vocab_size);
  CHECK(b.rope_inv_freq == a.rope_inv_freq);
  CHECK(b.arch == a.arch);
  const std::string text = "<|im_start|>user\nkey 42 holds 7, 1234 apples.<|im_end|>";
  const std::vector<int32_t> ids = from_gguf->tokenizer().encode(text);
  CHECK(from_folder->tokenizer().encode(text) == ids);
  CHECK(from_folder->tokenizer().bos_id() == from_gguf->tokenizer().bos_id());
  CHECK(from_folder->tokenizer().eos_id() == from_gguf->tokenizer().eos_id());
  CHECK(from_folder->file().get_string("tokenizer.chat_template") ==
        from_gguf->file().get_string("tokenizer.chat_template"));
  KvCache kv_a = make_full_cache(from_gguf->kv_shape());
  KvCache kv_b = make_full_cache(from_folder->kv_shape());
  const std::vector<float> la = from_gguf->forward(ids, kv_a, /*all_logits=*/true);
  const std::vector<float> lb = from_folder->forward(ids, kv_b, /*all_logits=*/true);
  REQUIRE(la.size() == lb.size());
  CHECK(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0);
  // A decode step on each (the block kernels' path for few rows).
  const std::vector<float> da = from_gguf->forward({ids.back()}, kv_a);
  const std::vector<float> db = from_folder->forward({ids.back()}, kv_b);
  CHECK(std::memcmp(da.data(), db.data(), da.size() * sizeof(float)) == 0);
  // The folder's identity is its files' (names and bytes).
  const std::string sha = sha256_model(f.dir);
  CHECK(sha.size() == 64);
  CHECK(sha != sha256_model(f.gguf));
}

TEST_CASE("hf folder: sharded weights through model.safetensors.index.json", "[unit]") {
  Folder f = tiny_folder("hf_sharded");
  std::filesystem::remove(f.dir + "/model.safetensors");
  const size_t half = f.tensors.size() / 2;
  const std::vector<Tensor> first(f.tensors.begin(), f.tensors.begin() + half);
  const std::vector<Tensor> second(f.tensors.begin() + half, f.tensors.end());
  write_safetensors(f.dir + "/model-00001-of-00002.safetensors", first);
  write_safetensors(f.dir + "/model-00002-of-00002.safetensors", second);
  json map = json::object();
  for (const Tensor& t : first) map[t.name] = "model-00001-of-00002.safetensors";
  for (const Tensor& t : second) map[t.name] = "model-00002-of-00002.safetensors";
  write_json(f.dir + "/model.safetensors.index.json", {{"weight_map", map}});
  const auto model = LlamaModel::load(f.dir);
  const auto reference = LlamaModel::load(f.gguf);
  const std::vector<int32_t> ids = reference->tokenizer().encode("shards");
  KvCache kv_a = make_full_cache(reference->kv_shape());
  KvCache kv_b = make_full_cache(model->kv_shape());
  const auto la = reference->forward(ids, kv_a);
  const auto lb = model->forward(ids, kv_b);
  CHECK(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)) == 0);
  // A shard the index names outside the folder.
  map[first.front().name] = "../elsewhere.safetensors";
  write_json(f.dir + "/model.safetensors.index.json", {{"weight_map", map}});
  CHECK_THAT(load_error(f, "model.safetensors.index.json"),
             Catch::Contains("not a file name in the folder"));
}

TEST_CASE("hf folder: every bad folder is one InputError naming the file", "[unit]") {
  SECTION("a missing tensor") {
    Folder f = tiny_folder("hf_missing");
    f.tensors.erase(f.tensors.begin() + 3);
    f.write();
    CHECK_THAT(load_error(f, "model.safetensors"), Catch::Contains("missing tensor"));
  }
  SECTION("a wrong shape") {
    Folder f = tiny_folder("hf_shape");
    f.tensors[2].shape = {f.tensors[2].shape[0] * 2};
    f.tensors[2].values.resize(f.tensors[2].values.size() * 2);
    f.write();
    CHECK_THAT(load_error(f, "model.safetensors"), Catch::Contains("has shape"));
  }
  SECTION("a truncated shard") {
    Folder f = tiny_folder("hf_truncated");
    std::vector<uint8_t> bytes = testing::read_file_bytes(f.dir + "/model.safetensors");
    bytes.resize(bytes.size() - 100);
    testing::write_file(f.dir + "/model.safetensors", bytes);
    CHECK_THAT(load_error(f, "model.safetensors"), Catch::Contains("truncated"));
  }
  SECTION("a header length past the file") {
    Folder f = tiny_folder("hf_header");
    std::vector<uint8_t> bytes = testing::read_file_bytes(f.dir + "/model.safetensors");
    bytes[7] = 0x7F;
    testing::write_file(f.dir + "/model.safetensors", bytes);
    CHECK_THAT(load_error(f, "model.safetensors"), Catch::Contains("header length"));
  }
  SECTION("overlapping tensors") {
    Folder f = tiny_folder("hf_overlap");
    write_safetensors(f.dir + "/model.safetensors", f.tensors, [&](json& h) {
      h[f.tensors[1].name]["data_offsets"] = h[f.tensors[0].name]["data_offsets"];
      h[f.tensors[1].name]["shape"] = h[f.tensors[0].name]["shape"];
    });
    CHECK_THAT(load_error(f, "model.safetensors"), Catch::Contains("overlap"));
  }
  SECTION("an unknown dtype, and an integer weight") {
    Folder f = tiny_folder("hf_dtype");
    write_safetensors(f.dir + "/model.safetensors", f.tensors,
                      [&](json& h) { h[f.tensors[0].name]["dtype"] = "F12"; });
    CHECK_THAT(load_error(f, "model.safetensors"), Catch::Contains("unknown dtype"));
    write_safetensors(f.dir + "/model.safetensors", f.tensors,
                      [&](json& h) { h[f.tensors[0].name]["dtype"] = "I32"; });
    CHECK_THAT(load_error(f, "model.safetensors"), Catch::Contains("expected BF16, F16 or F32"));
  }
  SECTION("an architecture kvbench does not run") {
    Folder f = tiny_folder("hf_arch");
    f.config["architectures"] = {"GPTNeoXForCausalLM"};
    f.write();
    CHECK_THAT(load_error(f, "config.json"), Catch::Contains("GPTNeoXForCausalLM"));
  }
  SECTION("a vocabulary larger than any model's (no allocation of that size)") {
    Folder f = tiny_folder("hf_vocab");
    f.config["vocab_size"] = int64_t{1} << 40;
    f.write();
    CHECK_THAT(load_error(f, "config.json"), Catch::Contains("vocab_size"));
  }
  SECTION("RoPE scaling kvbench does not implement") {
    Folder f = tiny_folder("hf_rope");
    f.config["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
    f.write();
    CHECK_THAT(load_error(f, "config.json"), Catch::Contains("yarn"));
  }
  SECTION("a pre-tokenizer kvbench does not implement") {
    Folder f = tiny_folder("hf_pre");
    f.tokenizer["pre_tokenizer"] = {{"type", "Whitespace"}};
    f.write();
    CHECK_THAT(load_error(f, "tokenizer.json"), Catch::Contains("pre_tokenizer"));
  }
  SECTION("a tokenizer that is not BPE") {
    Folder f = tiny_folder("hf_unigram");
    f.tokenizer["model"]["type"] = "Unigram";
    f.write();
    CHECK_THAT(load_error(f, "tokenizer.json"), Catch::Contains("not BPE"));
  }
  SECTION("a missing tokenizer_config.json, and JSON that is not JSON") {
    Folder f = tiny_folder("hf_no_config");
    std::filesystem::remove(f.dir + "/tokenizer_config.json");
    CHECK_THAT(load_error(f, "tokenizer_config.json"), Catch::Contains("missing"));
    testing::write_file(f.dir + "/config.json", {'{', '"'});
    CHECK_THAT(load_error(f, "config.json"), Catch::Contains("not JSON"));
  }
}

TEST_CASE("hf folder: a random Qwen3 made by transformers, logits within 1e-3 of its own",
          "[unit]") {
  // tests/fixtures/hf_qwen3_tiny: scripts/make_qwen3_fixture.py (config.json and bf16
  // model.safetensors as save_pretrained wrote them, transformers' fp32 logits beside them);
  // the tokenizer files are the tiny llama's, which the forward over fixed ids does not read.
  const std::string dir = testing::temp_path("hf_qwen3");
  std::filesystem::create_directories(dir);
  const std::string fixture = std::string(KVBENCH_FIXTURES) + "/hf_qwen3_tiny";
  for (const char* file : {"config.json", "model.safetensors"}) {
    std::filesystem::copy_file(fixture + "/" + file, dir + "/" + file,
                               std::filesystem::copy_options::overwrite_existing);
  }
  const Folder tiny = tiny_folder("hf_qwen3_tokenizer");
  write_json(dir + "/tokenizer.json", tiny.tokenizer);
  write_json(dir + "/tokenizer_config.json", tiny.tokenizer_config);
  const auto model = LlamaModel::load(dir);
  CHECK(model->config().arch->name == "qwen3");
  CHECK(model->config().head_dim == 64);  // not hidden_size / heads (16)
  CHECK(model->config().arch->qk_norm);
  const json expected = json::parse(std::ifstream(fixture + "/logits.json"));
  const auto ids = expected["ids"].get<std::vector<int32_t>>();
  KvCache kv = make_full_cache(model->kv_shape());
  const std::vector<float> logits = model->forward(ids, kv, /*all_logits=*/true);
  const int64_t vocab = model->config().vocab_size;
  double worst = 0;
  for (size_t pos = 0; pos < ids.size(); ++pos) {
    const auto row = expected["logits"][pos].get<std::vector<float>>();
    REQUIRE(static_cast<int64_t>(row.size()) == vocab);
    for (int64_t t = 0; t < vocab; ++t) {
      worst = std::max(worst, static_cast<double>(std::abs(logits[pos * vocab + t] - row[t])));
    }
  }
  WARN("Qwen3 against transformers: largest logit difference " << worst);
  CHECK(worst < 1e-3);
#ifdef KVBENCH_WITH_CUDA
  // The same on the GPU forward (under the CUDA emulation in CI's sanitizer tree).
  if (cuda_device_present()) {
    const auto gpu = LlamaModel::load(dir, ModelDevice::Cuda);
    KvCache gpu_kv = new_cache(*gpu, resolve_method_spec("full"));
    const std::vector<float> on_gpu = gpu->forward(ids, gpu_kv, /*all_logits=*/true);
    REQUIRE(on_gpu.size() == logits.size());
    double gap = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      gap = std::max(gap, static_cast<double>(std::abs(on_gpu[i] - logits[i])));
    }
    WARN("Qwen3 on the GPU forward against the CPU's: largest logit difference " << gap);
    CHECK(gap < 1e-3);
  }
#endif
}
