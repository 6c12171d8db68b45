// A plugin that throws while it registers, after adding one good method: neither is kept.
#include <stdexcept>

#include "cache/plugin_api.h"

namespace {
void register_methods(kvbench::PluginMethods& methods) {
  kvbench::ScorerMethod m;
  m.name = "registered_before_the_throw";
  m.summary = "never registered";
  m.score = [](const kvbench::ScorerInput&, float*) { return false; };
  methods.add(m);
  throw std::runtime_error("out of coffee");
}
}  // namespace

KVBENCH_PLUGIN(register_methods)
