// A plugin: a shared module that adds methods to kvbench at run time, loaded with
// `kvbench --plugin libmy_method.so` or a sweep config's "plugins". It is built against the
// installed seam (find_package(kvbench), target kvbench::methods) and its undefined symbols
// resolve against the kvbench executable that loads it, as PostgreSQL's extensions do: the
// seam, the kernels and the shared policy helpers are the ones kvbench runs.
//
// In one source file:
//
//   void register_my_methods(kvbench::PluginMethods& methods) {
//     methods.add(my_scorer_method());   // a ScorerMethod (cache/scorer_method.h), or
//     methods.add(my_method_info());     // a MethodInfo with a policy of its own
//   }
//   KVBENCH_PLUGIN(register_my_methods)
//
// Keep the plugin's own code in an anonymous namespace (or one of your own): a name it
// shares with kvbench's would bind to kvbench's definition. docs/methods.md, "Write your own
// method", walks through one.
#pragma once

#include <utility>
#include <vector>

#include "cache/registry.h"
#include "cache/scorer_method.h"

// What a plugin and the kvbench that loads it must agree on: MethodInfo, the policy, store
// and read-policy interfaces, ScorerMethod. Raised whenever one of them changes: 2 since
// TokenPolicy::plans_on_kv and LayerKv::attend_scored (version 1 plugins crashed in them),
// 3 since LayerKv::settle_each_chunk and KvCache::settle_context_chunks, 4 since
// AttentionQuery::rounding, 5 since PrefillAttention::sparse_after_context, 6 since
// TokenPolicy::adopt_scores, 7 since DenseKv's checked accessors (key, value, position), 8 since
// MethodInfo::make_device_layers (a storage method's device twin) replaced cuda_store and
// MethodInfo::reuses_blocks, 9 since DenseKv::head_tokens, TokenPolicy::reads_ragged_heads and
// LayerKv::heads_view (a full policy under adakv+ reads layers whose heads hold their own
// counts) and MethodInfo::uncompressed_tiers. (The built-in methods registering themselves, register_builtin, and
// cache/windowed_policy.h, a base a plugin may use, changed no declaration a plugin already
// used: the hash moved with them, the version did not; nor did RaggedView's copy starting
// empty.)
// The hash is of every installed seam header (cache/*.h) and every header they include,
// comments aside ("<version>:<sha256>"); a test fails when they change and it is not
// recorded again (tests/test_plugins.cpp).
#define KVBENCH_PLUGIN_INTERFACE_VERSION 9
#define KVBENCH_PLUGIN_INTERFACE_HASH \
  "9:d92002be84308246d66ef03f20fa97f8076a371527eac4d950b59ea8d76e9a82"

namespace kvbench {

// The methods a plugin's registration adds: all of them are registered once it returns, none
// if it throws.
class PluginMethods {
 public:
  void add(MethodInfo method) { methods_.push_back(std::move(method)); }
  void add(ScorerMethod method) { methods_.push_back(scorer_method(std::move(method))); }
  std::vector<MethodInfo>& methods() { return methods_; }

 private:
  std::vector<MethodInfo> methods_;
};

}  // namespace kvbench

// The one C function a plugin exports. kvbench calls it with its interface version; the
// plugin registers only when the two are equal, and always returns its own.
#define KVBENCH_PLUGIN_ENTRY_POINT "kvbench_plugin_register"
extern "C" {
typedef int (*KvbenchPluginEntry)(int host_interface_version, kvbench::PluginMethods* methods);
}

#define KVBENCH_PLUGIN(register_function)                                               \
  extern "C" __attribute__((visibility("default"))) int kvbench_plugin_register(        \
      int host_interface_version, kvbench::PluginMethods* methods) {                    \
    if (host_interface_version == KVBENCH_PLUGIN_INTERFACE_VERSION) {                   \
      register_function(*methods);                                                      \
    }                                                                                   \
    return KVBENCH_PLUGIN_INTERFACE_VERSION;                                            \
  }
