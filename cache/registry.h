// The registry of cache methods: each method's name, stage, parameters (with defaults
// and checks), paper, and factory. `kvbench list methods` prints it; make_cache builds a
// sequence's cache from a spec string.
//
// Adding a method: write methods/<name>.cpp with its TokenPolicy and a
// `MethodInfo <name>_method()` function, declare it in methods/method_list.cpp and add it
// to the list there, which each program's main registers (methods/builtin_methods.h). Out of
// the tree, a plugin registers its methods at run time (cache/plugin_api.h; docs/methods.md,
// "Write your own method").
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cache/kv_cache.h"
#include "common/method_spec.h"

namespace kvbench {
class HeadAllocation;  // cache/allocation.h
class PrefillAttention;  // cache/prefill_attention.h
}

namespace kvbench {

// Text: any value (a path, host:port); Bytes: a size such as 64MB, 1GB or 4096 (binary
// multiples: KB = 1024).
enum class ParamType { Int, Float, Choice, Text, Bytes };

constexpr double kNoMax = 1e18;  // ParamInfo::max meaning "no upper bound"
// The bound of every parameter that counts tokens, pages or layers: 2^24, beyond any model's
// context, so that no spec string can make a method's arithmetic overflow or its buffers
// grow past what a context could need.
constexpr double kMaxTokens = 16777216;

struct ParamInfo {
  std::string name;
  ParamType type = ParamType::Int;
  std::string default_value;  // "" = no default: unset unless given
  std::string help;
  double min = 0;  // inclusive bounds for Int and Float
  double max = kNoMax;
  bool min_exclusive = false;        // (min, max] as for ratio
  std::vector<std::string> choices;  // for Choice
  std::string replaces;  // given, this parameter stands in for that one (ratio for budget),
                         // whose default is then not filled in
};

// Parameters as methods declare them.
ParamInfo int_param(const std::string& name, int64_t default_value, double min, double max,
                    const std::string& help);
ParamInfo float_param(const std::string& name, const std::string& default_value, double min,
                      double max, const std::string& help);
ParamInfo choice_param(const std::string& name, const std::string& default_value,
                       const std::vector<std::string>& choices, const std::string& help);
ParamInfo text_param(const std::string& name, const std::string& default_value,
                     const std::string& help);
ParamInfo bytes_param(const std::string& name, const std::string& default_value,
                      const std::string& help);

// "64MB" -> 67108864; false unless a non-negative integer with an optional B, KB, MB, GB or
// TB suffix (binary multiples).
bool parse_byte_size(const std::string& text, int64_t* bytes);

// A component's parameters after validation, defaults filled in.
class MethodParams {
 public:
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  bool given(const std::string& name) const {
    return given_.count(name) > 0;
  }  // written in the spec
  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;
  int64_t get_bytes(const std::string& name) const;
  const std::string& get(const std::string& name) const;

  void set(const std::string& name, const std::string& value, bool given);
  // "key=value,..." with every parameter that has a value, in registry order (canonical).
  std::string text() const;

 private:
  std::map<std::string, std::string> values_;
  std::map<std::string, bool> given_;
  std::vector<std::string> order_;
};

// What a method fills in a cache (cache/kv_cache.h); a spec composes at most one of each.
enum class MethodKind {
  Full,       // the full cache, no policy
  Eviction,   // a TokenPolicy deciding what each layer keeps (stage 2: evict or merge)
  Storage,    // the layer stores: how what is kept is held and read (KIVI's packed form)
  Retrieval,  // a ReadPolicy choosing what each decode query reads (stage 3: Quest)
  Reuse,      // KV kept across requests (stage 4: prefix blocks, CacheBlend's chunks); the
              // session drives it, the cache of a sequence does not change
  Tiers,      // where reused KV is stored: device, CPU, disk, Redis (needs a Reuse method)
  Pinning,    // how long reused KV stays pinned in device memory between requests (apc_ttl;
              // needs prefix)
  Allocation,  // how many tokens each KV head of a layer keeps (AdaKV), in front of an
               // eviction method that ranks per KV head: adakv+snapkv
  Prefill,     // which keys each prefill query reads (stage 1: a_shape, tri_shape,
               // minference); the cache stays full
};

struct MethodInfo {
  std::string name;  // lower-case letters, digits and '_', starting with a letter
  MethodKind kind = MethodKind::Eviction;
  std::string stage;    // e.g. "2 (after prefill) + decode"
  std::string summary;  // one line: what it keeps
  std::string paper;    // title, venue/arXiv id
  // Where kvbench departs from the authors' code, or chooses where it leaves room (one
  // line each; `kvbench list methods` prints them).
  std::vector<std::string> choices;
  std::vector<ParamInfo> params;
  // A storage method whose stores round the context as it comes in, so that the context's
  // own attention reads the rounded rows (the fp16, bf16 and fp8 caches): it cannot be
  // forked from a prefill through the fp32 full cache (harness/shared_prefill.h).
  bool context_reads_store = false;
  // A storage method whose stores choose their layout from the queries they see
  // (LayerKv::observe_queries: ThinK's key channels): a store forked from the shared prefill
  // never saw them, so it prefills on its own.
  bool store_observes_queries = false;
  // A storage method that keeps what an eviction method in front plans to drop (MiKV): it
  // means nothing without one, so a spec must give one.
  bool needs_eviction = false;
  // An eviction method whose plans give each KV head its own count (RetainPlan::head_keep,
  // duo_attention): only a storage method that splits_heads may follow it.
  bool ragged_heads = false;
  // A storage method whose stores hold each KV head apart after a ragged plan
  // (LayerKv::head_store; cache/head_split.h): fp16, bf16, fp8, kivi.
  bool splits_heads = false;
  // A method that ranks whole KV heads by KvShape::head_retrieval: the driver probes the
  // model for it (harness/head_probe.h) before building such a cache.
  bool needs_head_retrieval = false;
  // An eviction method whose policy lets only the tokens it selects at one layer go on
  // through the later layers of the context's prefill (TokenPolicy::propagation_layer:
  // FastKV): its prefill is its own (no shared prefill) and runs in the CPU forward only.
  bool propagates_tokens = false;
  // A reuse method that keeps the context's KV in whole token blocks (prefix): a tiers method
  // stores its blocks and a pinning method pins them, and an eviction method may sit in front
  // (its compressed context reused whole). One that does not (cacheblend) takes none of these.
  bool reuses_blocks = false;
  // A tiers method: its parameters that open a tier below device memory. Those tiers hold
  // blocks uncompressed only, so with an eviction method in front (its compressed context
  // reused whole, from device memory) a spec that sets one is refused.
  std::vector<std::string> uncompressed_tiers;
  // Extra cross-parameter checks (e.g. budget xor ratio); throws InputError. May be empty.
  std::function<void(const MethodParams&)> check;
  // Builds one sequence's policy (Eviction), stores (Storage) or read policy (Retrieval). A
  // storage method that decides each token's precision from attention (ZipCache) has a
  // policy of its own too, and then takes no eviction or retrieval method before it.
  std::function<std::unique_ptr<TokenPolicy>(const MethodParams&, const KvShape&)> make_policy;
  std::function<std::vector<std::unique_ptr<LayerKv>>(const MethodParams&, const KvShape&)>
      make_layers;
  // A storage method's twin in device memory for --device cuda (methods/cuda/*_store.h), set
  // by a build with CUDA (KVBENCH_WITH_CUDA); empty: the method's stores are host-only.
  std::function<std::vector<std::unique_ptr<LayerKv>>(const MethodParams&, const KvShape&)>
      make_device_layers;
  std::function<std::unique_ptr<ReadPolicy>(const MethodParams&, const KvShape&)> make_reader;
  // An allocation method's rule (cache/allocation.h), and an eviction method that takes
  // one: its policy built to split each layer's budget over the KV heads by that rule.
  std::function<std::shared_ptr<const HeadAllocation>(const MethodParams&)> make_allocation;
  std::function<std::unique_ptr<TokenPolicy>(const MethodParams&, const KvShape&,
                                             std::shared_ptr<const HeadAllocation>)>
      make_allocated_policy;
  // A prefill method's attention (cache/prefill_attention.h; methods/sparse_prefill.h).
  std::function<std::shared_ptr<const PrefillAttention>(const MethodParams&)> make_prefill;
  // Filled in by the registry: the file name and sha256 of the plugin that registered the
  // method; empty for a method built into kvbench.
  std::string plugin;
  std::string plugin_sha256;
};

// Every registered method: the built-in ones, then those plugins added, in the order they
// came. Entries never move: a MethodInfo* stays valid while the program runs. Throws
// std::logic_error while nothing is registered: a program registers kvbench's own methods
// first thing in its main (methods/builtin_methods.h), as it loads plugins, and the seam
// never reaches up for them.
const std::deque<MethodInfo>& method_registry();
const MethodInfo* find_method(const std::string& name);

// Adds a plugin's methods, all or none (MethodInfo::plugin and plugin_sha256 set from the
// arguments). Throws InputError naming the method when a name is malformed or already
// registered (built in, by another plugin, or twice in `methods`), a parameter name repeats,
// or a kind is one a plugin cannot add (full, reuse, tiers, pinning: the session drives
// those) or lacks its factory.
void register_methods(std::vector<MethodInfo> methods, const std::string& plugin,
                      const std::string& plugin_sha256);
// kvbench's own methods, in listing order, checked as a plugin's are but of any kind (the
// full cache, reuse, tiers and pinning too). Called once, before any plugin's.
void register_builtin(std::vector<MethodInfo> methods);

// A parsed and validated spec: components with their infos and parameters.
struct ResolvedSpec {
  std::string canonical;  // every parameter written out, defaults included
  std::vector<std::pair<const MethodInfo*, MethodParams>> components;
  // The full cache alone: the reference every other method is measured against.
  bool is_full() const {
    return components.size() == 1 && components[0].first->kind == MethodKind::Full;
  }
  // The parameters of the component of `kind`, nullptr when there is none.
  const MethodParams* find(MethodKind kind) const;
};

// One component of a spec as its canonical text ("kivi:bits=2,residual=128,tail=kivi"):
// every parameter with a value, in registry order.
std::string component_text(const MethodInfo& info, const MethodParams& params);

// The full cache alone (MethodKind::Full), resolved: the reference every other method is
// measured against.
const ResolvedSpec& full_cache_spec();

// Parses and validates; throws InputError naming the spec and the expected form for
// unknown methods, unknown or missing parameters, values out of range, and compositions
// that cannot form: full with anything, two methods of one kind, eviction with retrieval
// (Quest reads pages of the whole cache), a storage method not last among the per-sequence
// methods (it stores what the methods before it keep: snapkv:budget=1024+kivi:bits=2),
// reuse with eviction (loaded blocks skip the prefill queries eviction scores), tiers
// without a reuse method.
ResolvedSpec resolve_method_spec(const std::string& spec);
ResolvedSpec resolve_method_spec(const MethodSpec& spec);  // the same, parsed already

// Whether a method's plans leave each KV head its own count (RetainPlan::head_keep): an
// allocation method, or an eviction method with ragged_heads.
bool makes_ragged_heads(const MethodInfo& info);

// Whether a method runs with --device cuda: not reuse, tiers or pinning (host memory), not a
// token-propagating prefill (CPU forward only), not a storage method without a device twin.
// The one place that says so: the CLI's check and the choices test read it.
bool runs_on_cuda(const MethodInfo& info);

// What the per-sequence components of `spec` build: a policy (Eviction), stores (Storage;
// empty without one) and a read policy (Retrieval); nullptr where none is given.
struct CacheParts {
  std::unique_ptr<TokenPolicy> policy;
  std::vector<std::unique_ptr<LayerKv>> layers;
  std::unique_ptr<ReadPolicy> reader;
  std::shared_ptr<const PrefillAttention> prefill;  // a Prefill method's attention
};
CacheParts make_cache_parts(const ResolvedSpec& spec, const KvShape& shape);

// The cache of one sequence for `spec`: each component fills its part (dense fp32 stores
// unless a storage method is given; Reuse and Tiers components are the session's).
KvCache make_cache(const ResolvedSpec& spec, const KvShape& shape);
KvCache make_cache(const std::string& spec, const KvShape& shape);

}  // namespace kvbench
