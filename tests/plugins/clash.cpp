// A plugin whose method takes the name of a built-in one.
#include "cache/plugin_api.h"

namespace {
void register_methods(kvbench::PluginMethods& methods) {
  kvbench::ScorerMethod m;
  m.name = "knorm";
  m.summary = "a second knorm";
  m.score = [](const kvbench::ScorerInput&, float*) { return false; };
  methods.add(m);
}
}  // namespace

KVBENCH_PLUGIN(register_methods)
