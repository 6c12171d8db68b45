// The plugin's one entry point: the methods it adds to kvbench.
#include "cache/plugin_api.h"

namespace example {
kvbench::ScorerMethod knorm_scorer();     // knorm_scorer.cpp
kvbench::ScorerMethod value_attention();  // value_attention.cpp

void register_methods(kvbench::PluginMethods& methods) {
  methods.add(knorm_scorer());
  methods.add(value_attention());
}
}  // namespace example

KVBENCH_PLUGIN(example::register_methods)
