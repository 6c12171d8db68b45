// The plugin's one entry point: the methods it adds to kvbench.
#include "cache/plugin_api.h"

namespace example {
kvbench::ScorerMethod knorm_scorer();     // knorm_scorer.cpp
kvbench::ScorerMethod value_attention();  // value_attention.cpp
kvbench::MethodInfo vatp_h2o();           // vatp_h2o.cpp: a full policy

void register_methods(kvbench::PluginMethods& methods) {
  methods.add(knorm_scorer());
  methods.add(value_attention());
  methods.add(vatp_h2o());
}
}  // namespace example

KVBENCH_PLUGIN(example::register_methods)
