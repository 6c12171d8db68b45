#include "harness/model/arch/architecture.h"

namespace kvbench {

// One per file in this folder; a new architecture is declared and listed here.
extern const Architecture kLlama, kQwen2, kQwen3;

const std::vector<const Architecture*>& architectures() {
  static const std::vector<const Architecture*> all = {&kLlama, &kQwen2, &kQwen3};
  return all;
}

const Architecture* find_architecture(std::string_view name) {
  for (const Architecture* a : architectures()) {
    if (a->name == name) return a;
  }
  return nullptr;
}

const Architecture* find_hf_architecture(std::string_view hf_class) {
  for (const Architecture* a : architectures()) {
    for (std::string_view c : a->hf_classes) {
      if (!c.empty() && c == hf_class) return a;
    }
  }
  return nullptr;
}

namespace {
std::string joined(bool hf) {
  std::string out;
  for (const Architecture* a : architectures()) {
    for (std::string_view n : hf ? a->hf_classes : std::array<std::string_view, 4>{a->name}) {
      if (!n.empty()) out += (out.empty() ? "" : ", ") + std::string(n);
    }
  }
  return out;
}
}  // namespace

std::string architecture_names() { return joined(false); }
std::string hf_class_names() { return joined(true); }

}  // namespace kvbench
