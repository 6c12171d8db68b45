// The models setup fetches (scripts/setup.sh), by the short names `--model` accepts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvbench {

struct KnownModel {
  std::string name;    // short name for --model: "smollm2-135m"
  std::string file;    // file name in the models folder
  std::string source;  // where setup gets it (PyPI packages)
  // Fetched by kvbench on its first use (scripts/fetch_model.sh), not by setup: too large
  // to download for a run that does not ask for it.
  bool on_demand = false;
  int64_t bytes = 0;  // the file's size
};

// Every model kvbench fetches by name; the first is the default.
const std::vector<KnownModel>& known_models();

// The model with this short name, or nullptr.
const KnownModel* find_known_model(const std::string& name);

// The folder setup fetches models into (the default model's folder).
std::string models_dir();

// The path of a --model value: a short name's file in models_dir(), anything else as given.
std::string model_path_of(const std::string& name_or_path);

// The short name of a model file (matched by file name), or "" for any other file.
std::string known_model_name(const std::string& path);

}  // namespace kvbench
