// The built-in methods, in the order `kvbench list methods` prints them. A method that is
// not finished is not listed here.
#include "methods/builtin_methods.h"

#include <mutex>

#include "cache/registry.h"

namespace kvbench {

MethodInfo full_method();
MethodInfo a_shape_method();
MethodInfo tri_shape_method();
MethodInfo minference_method();
MethodInfo streamingllm_method();
MethodInfo h2o_method();
MethodInfo snapkv_method();
MethodInfo pyramidkv_method();
MethodInfo adakv_method();
MethodInfo criticalkv_method();
MethodInfo cake_method();
MethodInfo d2o_method();
MethodInfo uncomp_method();
MethodInfo fastkv_method();
MethodInfo chunkkv_method();
MethodInfo windowkv_method();
MethodInfo tova_method();
MethodInfo knorm_method();
MethodInfo keydiff_method();
MethodInfo kvmerger_method();
MethodInfo cam_method();
MethodInfo chelsea_method();
MethodInfo expected_attention_method();
MethodInfo caote_method();
MethodInfo lagkv_method();
MethodInfo kvzip_method();
MethodInfo triattention_method();
MethodInfo epicache_method();
MethodInfo sage_kv_method();
MethodInfo scope_method();
MethodInfo lazy_eviction_method();
MethodInfo graphkv_method();
MethodInfo compresskv_method();
MethodInfo shotkv_method();
MethodInfo simlayerkv_method();
MethodInfo lacache_method();
MethodInfo duo_attention_method();
MethodInfo fp16_method();
MethodInfo bf16_method();
MethodInfo fp8_method();
MethodInfo kivi_method();
MethodInfo mikv_method();
MethodInfo zipcache_method();
MethodInfo pca_kv_method();
MethodInfo think_method();
MethodInfo kvquant_keys_method();
MethodInfo quest_method();
MethodInfo retrieval_attention_method();
MethodInfo prefix_method();
MethodInfo tiers_method();
MethodInfo apc_ttl_method();
MethodInfo cacheblend_method();

namespace {

std::vector<MethodInfo> builtin_methods() {
  return {
      full_method(),
      a_shape_method(),
      tri_shape_method(),
      minference_method(),
      streamingllm_method(),
      h2o_method(),
      snapkv_method(),
      pyramidkv_method(),
      adakv_method(),
      criticalkv_method(),
      cake_method(),
      d2o_method(),
      uncomp_method(),
      fastkv_method(),
      chunkkv_method(),
      windowkv_method(),
      tova_method(),
      knorm_method(),
      keydiff_method(),
      kvmerger_method(),
      cam_method(),
      chelsea_method(),
      expected_attention_method(),
      caote_method(),
      lagkv_method(),
      kvzip_method(),
      triattention_method(),
      epicache_method(),
      sage_kv_method(),
      scope_method(),
      lazy_eviction_method(),
      graphkv_method(),
      compresskv_method(),
      shotkv_method(),
      simlayerkv_method(),
      lacache_method(),
      duo_attention_method(),
      fp16_method(),
      bf16_method(),
      fp8_method(),
      kivi_method(),
      mikv_method(),
      zipcache_method(),
      pca_kv_method(),
      think_method(),
      kvquant_keys_method(),
      quest_method(),
      retrieval_attention_method(),
      prefix_method(),
      tiers_method(),
      apc_ttl_method(),
      cacheblend_method(),
  };
}

}  // namespace

void register_builtin_methods() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin(builtin_methods()); });
}

}  // namespace kvbench
