#include "harness/model/hf_folder.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "common/files.h"
#include "common/input_error.h"
#include "harness/model/arch/architecture.h"
#include "harness/model/gguf.h"
#include "harness/model/safetensors.h"
#include "harness/model/tokenizer.h"

namespace kvbench {
namespace {

using nlohmann::json;

// The pre-tokenizers' split patterns, as tokenizer.json writes them (tokenizer.cpp's kLlama3
// and kQwen2: llama.cpp's pre-types of the same names).
const char* const kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

class Folder {
 public:
  explicit Folder(std::string dir) : dir_(std::move(dir)) {}

  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  bool has(const std::string& name) const {
    struct stat st {};
    return ::stat(path(name).c_str(), &st) == 0 && S_ISREG(st.st_mode);
  }
  [[noreturn]] void fail(const std::string& name, const std::string& why) const {
    throw InputError(path(name) + ": " + why);
  }
  // The file's text, read up to a cap (tokenizer.json, the largest, is 7-33 MB in the models
  // of the field).
  std::string text(const std::string& name) const {
    if (!has(name)) fail(name, "missing (a Hugging Face model folder holds it)");
    return read_regular_file(path(name), "model folder's file", uint64_t{256} << 20);
  }
  json object(const std::string& name) const {
    json j;
    try {
      j = json::parse(text(name));
    } catch (const json::exception& e) {
      fail(name, std::string("not JSON (") + e.what() + ")");
    }
    if (!j.is_object()) fail(name, "not a JSON object");
    return j;
  }

 private:
  std::string dir_;
};

GgufValue int_value(int64_t v) { return {GgufValueType::INT64, GgufValueType::INT64, v}; }
GgufValue float_value(double v) { return {GgufValueType::FLOAT64, GgufValueType::FLOAT64, v}; }
GgufValue bool_value(bool v) { return {GgufValueType::BOOL, GgufValueType::BOOL, v}; }
GgufValue string_value(std::string v) {
  return {GgufValueType::STRING, GgufValueType::STRING, std::move(v)};
}
GgufValue strings_value(std::vector<std::string> v) {
  return {GgufValueType::ARRAY, GgufValueType::STRING, std::move(v)};
}
GgufValue ints_value(std::vector<int64_t> v) {
  return {GgufValueType::ARRAY, GgufValueType::INT32, std::move(v)};
}

// config.json's field, checked for its type; `fallback` (null: required) when absent or null.
json field(const Folder& folder, const json& config, const char* key, json::value_t type,
           const json& fallback = nullptr) {
  if (!config.contains(key) || config[key].is_null()) {
    if (fallback.is_null()) folder.fail("config.json", std::string("has no '") + key + "'");
    return fallback;
  }
  const json& v = config[key];
  const bool ok = type == json::value_t::number_float ? v.is_number()
                  : type == json::value_t::number_integer ? v.is_number_integer()
                                                          : v.type() == type;
  if (!ok) folder.fail("config.json", std::string("'") + key + "' has the wrong type");
  return v;
}

// The architecture config.json's "architectures" names (arch/architecture.h).
const Architecture& architecture_of(const Folder& folder, const json& config) {
  const json archs = field(folder, config, "architectures", json::value_t::array);
  const std::string name = archs.empty() || !archs[0].is_string() ? "" : archs[0].get<std::string>();
  if (const Architecture* arch = find_hf_architecture(name)) return *arch;
  folder.fail("config.json", "architecture '" + one_line(name) + "' is not one kvbench runs (" +
                                 hf_class_names() + ")");
}

// Llama 3's RoPE scaling as llama.cpp's converter writes it: a divisor per frequency pair
// (LlamaModel.generate_extra_tensors).
std::vector<float> llama3_rope_divisors(const json& scaling, double theta, int64_t head_dim) {
  const double factor = scaling.value("factor", 8.0);
  const double low = scaling.value("low_freq_factor", 1.0);
  const double high = scaling.value("high_freq_factor", 4.0);
  const double old_context = scaling.value("original_max_position_embeddings", 8192.0);
  const double low_wavelen = old_context / low, high_wavelen = old_context / high;
  std::vector<float> divisors;
  for (int64_t i = 0; i < head_dim; i += 2) {
    const double freq = 1.0 / std::pow(theta, static_cast<double>(i) / head_dim);
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) {
      divisors.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      divisors.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (old_context / wavelen - low) / (high - low);
      divisors.push_back(static_cast<float>(1 / ((1 - smooth) / factor + smooth)));
    }
  }
  return divisors;
}

// A special token's text from tokenizer_config.json: a string, {"content": ...}, or none.
std::string token_text(const json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return "";
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

// The GGUF pre-tokenizer name of tokenizer.json's pre_tokenizer, or "" when kvbench has none.
std::string pre_tokenizer_name(const json& pre) {
  const auto is = [](const json& j, const char* type) {
    return j.is_object() && j.value("type", "") == type;
  };
  const auto byte_level = [&](const json& j, bool regex) {
    return is(j, "ByteLevel") && !j.value("add_prefix_space", false) &&
           j.value("use_regex", true) == regex;
  };
  if (byte_level(pre, true)) return "gpt2";
  if (!is(pre, "Sequence") || !pre.contains("pretokenizers") ||
      !pre["pretokenizers"].is_array() || pre["pretokenizers"].size() != 2) {
    return "";
  }
  const json& first = pre["pretokenizers"][0];
  const json& second = pre["pretokenizers"][1];
  if (is(first, "Digits") && first.value("individual_digits", false) && byte_level(second, true)) {
    return "smollm";
  }
  if (is(first, "Split") && byte_level(second, false) && first.contains("pattern") &&
      first["pattern"].is_object() && first["pattern"].contains("Regex") &&
      first["pattern"]["Regex"].is_string() && first.value("behavior", "") == "Isolated") {
    const std::string regex = first["pattern"]["Regex"].get<std::string>();
    if (regex == kLlama3Pattern) return "llama3";
    if (regex == kQwen2Pattern) return "qwen2";
  }
  return "";
}

// tokenizer.json and tokenizer_config.json as the converter's tokenizer.ggml.* keys.
void read_tokenizer(const Folder& folder, const json& config, int64_t vocab_size,
                    std::map<std::string, GgufValue>& meta) {
  const json tok = folder.object("tokenizer.json");
  const json tok_config = folder.object("tokenizer_config.json");
  const auto bad = [&](const std::string& why) { folder.fail("tokenizer.json", why); };
  if (!tok.contains("model") || !tok["model"].is_object() || tok["model"].value("type", "") != "BPE") {
    bad("the model is not BPE (kvbench reads byte-level BPE tokenizers)");
  }
  const json& model = tok["model"];
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") ||
      !model["merges"].is_array()) {
    bad("the BPE model has no vocab object or merges list");
  }
  const json pre = tok.contains("pre_tokenizer") ? tok["pre_tokenizer"] : json();
  const std::string pre_name = pre_tokenizer_name(pre);
  if (pre_name.empty()) {
    bad("pre_tokenizer " + one_line(pre.dump()).substr(0, 200) +
        " is not one kvbench implements (byte-level, SmolLM's digits, Llama 3's or Qwen2's split)");
  }
  // NFC (Qwen2's) composes what is decomposed; llama.cpp skips it too, and kvbench's tasks
  // are composed text: the one normalizer accepted (alone or in a Sequence).
  const auto accepted_normalizer = [](const json& n) {
    if (n.is_null() || (n.is_object() && n.value("type", "") == "NFC")) return true;
    if (!n.is_object() || n.value("type", "") != "Sequence" || !n.contains("normalizers") ||
        !n["normalizers"].is_array()) {
      return false;
    }
    for (const json& part : n["normalizers"]) {
      if (!part.is_object() || part.value("type", "") != "NFC") return false;
    }
    return true;
  };
  if (tok.contains("normalizer") && !accepted_normalizer(tok["normalizer"])) {
    bad("normalizer " + one_line(tok["normalizer"].dump()).substr(0, 200) +
        " is not implemented");
  }
  std::vector<std::string> tokens;
  std::vector<int64_t> types;
  const auto place = [&](int64_t id, const std::string& text, TokenType type) {
    if (id < 0 || id >= (int64_t{1} << 24)) bad("token id " + std::to_string(id) + " out of range");
    if (id >= static_cast<int64_t>(tokens.size())) {
      tokens.resize(static_cast<size_t>(id + 1));
      types.resize(static_cast<size_t>(id + 1), static_cast<int64_t>(TokenType::UNUSED));
    }
    tokens[id] = text;
    types[id] = static_cast<int64_t>(type);
  };
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer()) bad("vocab entry '" + one_line(text) + "' has no integer id");
    place(id.get<int64_t>(), text, TokenType::NORMAL);
  }
  if (tok.contains("added_tokens") && tok["added_tokens"].is_array()) {
    for (const json& added : tok["added_tokens"]) {
      if (!added.is_object() || !added.contains("id") || !added["id"].is_number_integer() ||
          !added.contains("content") || !added["content"].is_string()) {
        bad("an added_tokens entry has no integer id and text content");
      }
      // An added token past the embedding's rows (transformers' GGUF conversion adds some)
      // cannot be run by any forward: left out, as the model could not take its id.
      if (added["id"].get<int64_t>() >= vocab_size) continue;
      place(added["id"].get<int64_t>(), added["content"].get<std::string>(),
            added.value("special", false) ? TokenType::CONTROL : TokenType::USER_DEFINED);
    }
  }
  if (static_cast<int64_t>(tokens.size()) > vocab_size) {
    bad(std::to_string(tokens.size()) + " tokens, more than the embedding's " +
        std::to_string(vocab_size) + " rows");
  }
  // Ids no token names, and the embedding's rows past the tokenizer: the converter's pads.
  tokens.resize(static_cast<size_t>(vocab_size));
  types.resize(static_cast<size_t>(vocab_size), static_cast<int64_t>(TokenType::UNUSED));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] == static_cast<int64_t>(TokenType::UNUSED)) tokens[i] = "[PAD" + std::to_string(i) + "]";
  }
  // byte_fallback spells a piece no token covers with the <0xNN> byte tokens; a vocabulary
  // without them (transformers' conversion of SmolLM2's GGUF sets the flag on one) leaves the
  // piece to the unknown token as plain BPE does, so there the flag changes nothing.
  if (model.value("byte_fallback", false)) {
    static const char kHex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      const std::string byte_token = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
      if (model["vocab"].contains(byte_token)) {
        bad("byte_fallback with <0xNN> byte tokens is not implemented");
      }
    }
  }
  std::vector<std::string> merges;
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      merges.push_back(m.get<std::string>());
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    } else {
      bad("a merge is neither \"left right\" nor [left, right]");
    }
  }
  std::map<std::string, int64_t> ids;
  for (size_t i = 0; i < tokens.size(); ++i) ids.emplace(tokens[i], static_cast<int64_t>(i));
  // BOS and EOS: tokenizer_config.json's tokens, else config.json's ids (as the converter's
  // SpecialVocab reads them).
  const auto special_id = [&](const char* token_key, const char* id_key) -> int64_t {
    const std::string text = token_text(tok_config, token_key);
    if (!text.empty()) {
      const auto it = ids.find(text);
      if (it == ids.end()) {
        folder.fail("tokenizer_config.json", std::string(token_key) + " '" + one_line(text) +
                                                 "' is not a token of tokenizer.json");
      }
      return it->second;
    }
    if (config.contains(id_key) && config[id_key].is_number_integer()) {
      const int64_t id = config[id_key].get<int64_t>();
      if (id >= 0 && id < vocab_size) return id;
    }
    return -1;
  };
  meta["tokenizer.ggml.model"] = string_value("gpt2");
  meta["tokenizer.ggml.pre"] = string_value(pre_name);
  meta["tokenizer.ggml.tokens"] = strings_value(std::move(tokens));
  meta["tokenizer.ggml.token_type"] = ints_value(std::move(types));
  meta["tokenizer.ggml.merges"] = strings_value(std::move(merges));
  const int64_t bos = special_id("bos_token", "bos_token_id");
  const int64_t eos = special_id("eos_token", "eos_token_id");
  if (bos >= 0) meta["tokenizer.ggml.bos_token_id"] = int_value(bos);
  if (eos >= 0) meta["tokenizer.ggml.eos_token_id"] = int_value(eos);
  if (tok_config.contains("add_bos_token") && tok_config["add_bos_token"].is_boolean()) {
    meta["tokenizer.ggml.add_bos_token"] = bool_value(tok_config["add_bos_token"].get<bool>());
  } else {
    // A post-processor that puts a special token first adds BOS (Llama 3's TemplateProcessing).
    const json post = tok.contains("post_processor") ? tok["post_processor"] : json();
    const bool adds = post.is_object() && post.value("type", "") == "TemplateProcessing" &&
                      post.contains("single") && post["single"].is_array() &&
                      !post["single"].empty() && post["single"][0].contains("SpecialToken");
    meta["tokenizer.ggml.add_bos_token"] = bool_value(adds);
  }
  std::string chat_template;
  if (tok_config.contains("chat_template") && tok_config["chat_template"].is_string()) {
    chat_template = tok_config["chat_template"].get<std::string>();
  } else if (folder.has("chat_template.jinja")) {
    chat_template = folder.text("chat_template.jinja");
  }
  if (!chat_template.empty()) meta["tokenizer.chat_template"] = string_value(chat_template);
}

// The model's shards: model.safetensors, or those model.safetensors.index.json names.
std::map<std::string, std::shared_ptr<const SafetensorsFile>> open_shards(const Folder& folder) {
  std::set<std::string> names;
  if (folder.has("model.safetensors.index.json")) {
    const json index = folder.object("model.safetensors.index.json");
    if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
      folder.fail("model.safetensors.index.json", "has no weight_map object");
    }
    for (const auto& [tensor, file] : index["weight_map"].items()) {
      if (!file.is_string()) folder.fail("model.safetensors.index.json", "a weight_map value is not a file name");
      const std::string name = file.get<std::string>();
      if (name.empty() || name.find('/') != std::string::npos || name[0] == '.') {
        folder.fail("model.safetensors.index.json",
                    "shard '" + one_line(name) + "' is not a file name in the folder");
      }
      names.insert(name);
    }
  } else {
    names.insert("model.safetensors");
  }
  std::map<std::string, std::shared_ptr<const SafetensorsFile>> shards;
  for (const std::string& name : names) {
    if (!folder.has(name)) folder.fail(name, "missing (the model's weights)");
    shards[name] = std::make_shared<const SafetensorsFile>(folder.path(name));
  }
  return shards;
}

GgmlType ggml_type_of(const std::string& dtype) {
  if (dtype == "F32") return GgmlType::F32;
  if (dtype == "F16") return GgmlType::F16;
  return GgmlType::BF16;  // the caller checked it is one of the three
}

}  // namespace

std::unique_ptr<GgufFile> open_model_file(const std::string& path) {
  if (is_hf_folder(path)) return read_hf_folder(path);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    throw InputError(path + ": a folder without config.json; expected a GGUF file or a Hugging "
                     "Face model folder");
  }
  return std::make_unique<GgufFile>(path);
}

bool is_hf_folder(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
         ::stat((path + "/config.json").c_str(), &st) == 0;
}

std::unique_ptr<GgufFile> read_hf_folder(const std::string& dir) {
  const Folder folder(dir);
  const json config = folder.object("config.json");
  const Architecture& arch = architecture_of(folder, config);
  const std::string a = std::string(arch.name) + ".";
  using T = json::value_t;
  // Ranges as ModelConfig checks them, here before anything is sized by them.
  const auto integer = [&](const char* key, int64_t lo, int64_t hi, const json& fallback = nullptr) {
    const auto v = field(folder, config, key, T::number_integer, fallback).get<int64_t>();
    if (v < lo || v > hi) {
      folder.fail("config.json", std::string("'") + key + "' is " + std::to_string(v) +
                                     " (expected " + std::to_string(lo) + ".." +
                                     std::to_string(hi) + ")");
    }
    return v;
  };
  const auto number = [&](const char* key, double fallback) {
    return field(folder, config, key, T::number_float, fallback).get<double>();
  };
  const auto flag = [&](const char* key, bool fallback) {
    return field(folder, config, key, T::boolean, fallback).get<bool>();
  };
  const std::string act = field(folder, config, "hidden_act", json::value_t::string, "silu");
  if (act != "silu") {
    folder.fail("config.json", "hidden_act '" + one_line(act) + "' is not implemented (silu)");
  }
  if (flag("attention_bias", false) || flag("mlp_bias", false)) {
    folder.fail("config.json", "attention_bias or mlp_bias: biases on o_proj or the MLP are not implemented");
  }
  if (config.contains("sliding_window") && !config["sliding_window"].is_null() &&
      (!arch.sliding_window_flagged || flag("use_sliding_window", false))) {
    folder.fail("config.json", "sliding-window attention is not implemented (sliding_window is set)");
  }
  std::map<std::string, GgufValue> meta;
  meta["general.architecture"] = string_value(std::string(arch.name));
  std::string name = dir;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  meta["general.name"] = string_value(name.substr(name.find_last_of('/') + 1));
  const int64_t n_layers = integer("num_hidden_layers", 1, 4096);
  const int64_t n_embd = integer("hidden_size", 1, 1 << 18);
  const int64_t n_ff = integer("intermediate_size", 1, 1 << 22);
  const int64_t n_heads = integer("num_attention_heads", 1, 4096);
  const int64_t n_kv_heads = integer("num_key_value_heads", 1, n_heads, n_heads);
  const int64_t head_dim = integer("head_dim", 2, 1024, std::max<int64_t>(2, n_embd / n_heads));
  const int64_t vocab_size = integer("vocab_size", 1, 1 << 24);
  if (head_dim % 2 != 0) folder.fail("config.json", "head_dim must be even (RoPE rotates pairs)");
  meta[a + "block_count"] = int_value(n_layers);
  meta[a + "embedding_length"] = int_value(n_embd);
  meta[a + "feed_forward_length"] = int_value(n_ff);
  meta[a + "attention.head_count"] = int_value(n_heads);
  meta[a + "attention.head_count_kv"] = int_value(n_kv_heads);
  meta[a + "attention.key_length"] = int_value(head_dim);
  meta[a + "context_length"] = int_value(integer("max_position_embeddings", 1, 1 << 24));
  meta[a + "attention.layer_norm_rms_epsilon"] = float_value(number("rms_norm_eps", 1e-6));
  meta[a + "vocab_size"] = int_value(vocab_size);
  // RoPE: rope_theta and rope_scaling, or transformers 5's rope_parameters holding both.
  json rope = config.contains("rope_parameters") && config["rope_parameters"].is_object()
                  ? config["rope_parameters"]
                  : json::object();
  const double theta = rope.contains("rope_theta") && rope["rope_theta"].is_number()
                           ? rope["rope_theta"].get<double>()
                           : number("rope_theta", 10000.0);
  meta[a + "rope.freq_base"] = float_value(theta);
  if (config.contains("rope_scaling") && config["rope_scaling"].is_object()) rope = config["rope_scaling"];
  const std::string rope_type = rope.value("rope_type", rope.value("type", std::string("default")));
  std::vector<std::shared_ptr<const void>> owned;
  std::vector<GgufTensorInfo> tensors;
  if (rope_type == "linear") {
    meta[a + "rope.scaling.type"] = string_value("linear");
    meta[a + "rope.scaling.factor"] = float_value(rope.value("factor", 1.0));
  } else if (rope_type == "llama3") {
    auto divisors = std::make_shared<std::vector<float>>(llama3_rope_divisors(rope, theta, head_dim));
    GgufTensorInfo t;
    t.name = "rope_freqs.weight";
    t.shape = {static_cast<int64_t>(divisors->size())};
    t.type = GgmlType::F32;
    t.data = reinterpret_cast<const uint8_t*>(divisors->data());
    tensors.push_back(t);
    owned.push_back(divisors);
  } else if (rope_type != "default") {
    folder.fail("config.json", "RoPE scaling '" + one_line(rope_type) +
                                   "' is not implemented (default, linear, llama3)");
  }
  read_tokenizer(folder, config, vocab_size, meta);

  const auto shards = open_shards(folder);
  for (const auto& [name, shard] : shards) owned.push_back(shard);
  const auto find = [&](const std::string& name) -> std::pair<const SafetensorsTensor*, std::string> {
    for (const auto& [file, shard] : shards) {
      if (const SafetensorsTensor* t = shard->find(name)) return {t, file};
    }
    return {nullptr, ""};
  };
  // GGUF name <- Hugging Face name; `permute_heads` > 0: llama's Q or K rows into the
  // converter's interleaved RoPE order for that many heads.
  const auto add = [&](const std::string& gguf, const std::string& hf, std::vector<int64_t> shape,
                       int64_t permute_heads = 0) {
    const auto [t, file] = find(hf);
    if (!t) {  // named where the weights are listed: the index, or the one file
      const bool indexed = folder.has("model.safetensors.index.json");
      folder.fail(indexed ? "model.safetensors.index.json" : shards.begin()->first,
                  "missing tensor '" + hf + "' (" + std::string(arch.name) + " needs it)");
    }
    if (t->shape != shape) {
      folder.fail(file, "tensor '" + hf + "' has shape " + shape_text(t->shape) + ", expected " +
                            shape_text(shape));
    }
    if (t->dtype != "F32" && t->dtype != "F16" && t->dtype != "BF16") {
      folder.fail(file, "tensor '" + hf + "' is " + t->dtype + " (expected BF16, F16 or F32)");
    }
    GgufTensorInfo info;
    info.name = gguf;
    info.shape.assign(shape.rbegin(), shape.rend());  // ggml order: the row first
    info.type = ggml_type_of(t->dtype);
    info.data = t->data;
    if (permute_heads > 0) {
      const int64_t rows = shape[0], row_bytes = t->bytes / rows;
      const int64_t d = rows / permute_heads, half = d / 2;
      auto copy = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(t->bytes));
      for (int64_t h = 0; h < permute_heads; ++h) {
        for (int64_t i = 0; i < half; ++i) {
          for (int64_t j = 0; j < 2; ++j) {
            std::memcpy(copy->data() + (h * d + 2 * i + j) * row_bytes,
                        t->data + (h * d + j * half + i) * row_bytes, row_bytes);
          }
        }
      }
      info.data = copy->data();
      owned.push_back(copy);
    }
    tensors.push_back(info);
  };
  const int64_t q_width = n_heads * head_dim, kv_width = n_kv_heads * head_dim;
  // transformers holds every model's Q and K rows in NEOX's half-split order.
  const bool interleave = arch.rope == RopeStyle::Interleaved;
  add("token_embd.weight", "model.embed_tokens.weight", {vocab_size, n_embd});
  for (int64_t l = 0; l < n_layers; ++l) {
    const std::string g = "blk." + std::to_string(l) + ".";
    const std::string h = "model.layers." + std::to_string(l) + ".";
    add(g + "attn_norm.weight", h + "input_layernorm.weight", {n_embd});
    add(g + "ffn_norm.weight", h + "post_attention_layernorm.weight", {n_embd});
    add(g + "attn_q.weight", h + "self_attn.q_proj.weight", {q_width, n_embd}, interleave ? n_heads : 0);
    add(g + "attn_k.weight", h + "self_attn.k_proj.weight", {kv_width, n_embd}, interleave ? n_kv_heads : 0);
    add(g + "attn_v.weight", h + "self_attn.v_proj.weight", {kv_width, n_embd});
    if (arch.qk_norm) {
      add(g + "attn_q_norm.weight", h + "self_attn.q_norm.weight", {head_dim});
      add(g + "attn_k_norm.weight", h + "self_attn.k_norm.weight", {head_dim});
    }
    if (arch.qkv_bias) {
      add(g + "attn_q.bias", h + "self_attn.q_proj.bias", {q_width});
      add(g + "attn_k.bias", h + "self_attn.k_proj.bias", {kv_width});
      add(g + "attn_v.bias", h + "self_attn.v_proj.bias", {kv_width});
    }
    add(g + "attn_output.weight", h + "self_attn.o_proj.weight", {n_embd, q_width});
    add(g + "ffn_gate.weight", h + "mlp.gate_proj.weight", {n_ff, n_embd});
    add(g + "ffn_up.weight", h + "mlp.up_proj.weight", {n_ff, n_embd});
    add(g + "ffn_down.weight", h + "mlp.down_proj.weight", {n_embd, n_ff});
  }
  add("output_norm.weight", "model.norm.weight", {n_embd});
  if (!flag("tie_word_embeddings", false)) add("output.weight", "lm_head.weight", {vocab_size, n_embd});
  return std::make_unique<GgufFile>(dir, std::move(meta), std::move(tensors), std::move(owned));
}

}  // namespace kvbench
