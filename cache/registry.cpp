#include "cache/registry.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include "cache/full_cache.h"
#include "cache/head_split.h"
#include "common/input_error.h"

namespace kvbench {

namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

bool parse_int(const std::string& s, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_float(const std::string& s, double* out) {
  // Decimal only: strtod also reads hex floats (0x1p-1), which no spec is written in.
  if (s.find_first_not_of("0123456789.eE+-") != std::string::npos) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end == s.c_str() || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

std::string format_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.15g", x);
  return buf;
}

std::string range_text(const ParamInfo& p) {
  const std::string lo = (p.min_exclusive ? "(" : "[") + format_number(p.min);
  const std::string hi = p.max >= 1e9 ? "inf)" : format_number(p.max) + "]";
  return lo + ", " + hi;
}

// Checks one value against its ParamInfo; returns the reason it is wrong, or "".
std::string check_value(const ParamInfo& p, const std::string& value) {
  double x = 0;
  if (p.type == ParamType::Text) return "";
  if (p.type == ParamType::Bytes) {
    int64_t bytes = 0;
    return parse_byte_size(value, &bytes) ? "" : "must be a size such as 4096, 64MB or 1GB";
  }
  if (p.type == ParamType::Choice) {
    for (const auto& c : p.choices) {
      if (c == value) return "";
    }
    return "must be one of " + join_names(p.choices);
  }
  if (p.type == ParamType::Int) {
    int64_t i = 0;
    if (!parse_int(value, &i)) return "must be an integer";
    x = static_cast<double>(i);
  } else if (!parse_float(value, &x)) {
    return "must be a number";
  }
  const bool below = p.min_exclusive ? x <= p.min : x < p.min;
  if (below || x > p.max) return "must be in " + range_text(p);
  return "";
}

// The kinds a spec composes (MethodKind): `info` joins the components before it (`seen`).
// The eviction methods an allocation method can split the budget of, for error messages.
// The registered methods `pick` picks, named in a list for error messages.
std::string methods_where(const std::function<bool(const MethodInfo&)>& pick) {
  std::vector<std::string> names;
  for (const auto& m : method_registry()) {
    if (pick(m)) names.push_back(m.name);
  }
  return join_names(names);
}

std::string allocating_methods() {
  return methods_where([](const MethodInfo& m) { return bool(m.make_allocated_policy); });
}

// A spec to quote in an error message: the first registered eviction method that an
// allocation method can split, at a quarter of the context ("<name>:ratio=0.25").
std::string example_eviction_spec() {
  for (const auto& m : method_registry()) {
    if (m.make_allocated_policy) return m.name + ":ratio=0.25";
  }
  return "<eviction method>:ratio=0.25";
}

// The reuse methods that keep blocks (tiers and pinning need one).
std::string block_reuse_methods() {
  return methods_where(
      [](const MethodInfo& m) { return m.kind == MethodKind::Reuse && m.reuses_blocks; });
}

std::string head_splitting_methods() {
  return methods_where([](const MethodInfo& m) { return m.splits_heads; });
}

const MethodInfo* ragged_component(const std::map<MethodKind, const MethodInfo*>& seen) {
  for (const auto& kind_info : seen) {
    if (makes_ragged_heads(*kind_info.second)) return kind_info.second;
  }
  return nullptr;
}

// A sparse prefill attends over each layer's fp32 view of its store: not over KV reused
// without a prefill, nor over heads of their own or keys kept apart from the view (MiKV).
void check_prefill_composition(const std::string& text,
                               const std::map<MethodKind, const MethodInfo*>& seen,
                               const MethodInfo& info) {
  const auto prefill = seen.find(MethodKind::Prefill);
  const MethodInfo* sparse = info.kind == MethodKind::Prefill ? &info
                             : prefill != seen.end()          ? prefill->second
                                                              : nullptr;
  if (!sparse) return;
  std::vector<const MethodInfo*> all{&info};
  for (const auto& kind_info : seen) all.push_back(kind_info.second);
  for (const MethodInfo* other : all) {
    if (other == sparse) continue;
    if (other->kind == MethodKind::Reuse || other->kind == MethodKind::Tiers ||
        other->kind == MethodKind::Pinning) {
      fail_spec(text, "'" + sparse->name + "' sparsifies the prefill, which '" + other->name +
                          "' skips by reusing KV; they cannot compose");
    }
    if (other->kind == MethodKind::Allocation || other->ragged_heads || other->needs_eviction) {
      fail_spec(text, "'" + sparse->name + "' attends over the fp32 view of an equal-heads "
                          "store; '" + other->name + "' keeps KV outside it");
    }
  }
}

void check_composition(const std::string& text, const std::map<MethodKind, const MethodInfo*>& seen,
                       const MethodInfo& info, size_t n_components) {
  if (info.kind == MethodKind::Full) {
    if (n_components > 1) {
      fail_spec(text, "'full' is the uncompressed cache and cannot compose with anything");
    }
    return;
  }
  const auto same = seen.find(info.kind);
  if (same != seen.end()) {
    const char* what = info.kind == MethodKind::Eviction     ? "eviction or merging"
                       : info.kind == MethodKind::Storage    ? "storage"
                       : info.kind == MethodKind::Retrieval  ? "retrieval"
                       : info.kind == MethodKind::Reuse      ? "reuse"
                       : info.kind == MethodKind::Allocation ? "allocation"
                       : info.kind == MethodKind::Pinning    ? "pinning"
                       : info.kind == MethodKind::Prefill    ? "sparse prefill"
                                                             : "tiers";
    fail_spec(text, "'" + same->second->name + "' and '" + info.name +
                        "' cannot compose: a cache takes at most one " + what + " method");
  }
  const bool per_sequence = info.kind != MethodKind::Reuse && info.kind != MethodKind::Tiers &&
                            info.kind != MethodKind::Pinning;
  const auto storage = seen.find(MethodKind::Storage);
  if (storage != seen.end() && per_sequence) {
    fail_spec(text, "'" + storage->second->name + "' stores what the methods before it keep, " +
                        "so it comes last ('" + info.name + "' follows it)");
  }
  if (info.kind == MethodKind::Storage && info.make_policy &&
      (seen.count(MethodKind::Eviction) || seen.count(MethodKind::Retrieval))) {
    fail_spec(text, "'" + info.name + "' chooses its own precision for every token from "
                        "attention, so it takes no eviction or retrieval method before it");
  }
  const auto allocation = seen.find(MethodKind::Allocation);
  if (allocation != seen.end() && info.kind == MethodKind::Eviction &&
      !info.make_allocated_policy) {
    fail_spec(text, "'" + allocation->second->name + "' splits the budget of an eviction method "
                        "that ranks per KV head, and '" + info.name + "' takes none (those that "
                        "do: " + allocating_methods() + ")");
  }
  if (info.kind == MethodKind::Allocation && seen.count(MethodKind::Eviction)) {
    fail_spec(text, "'" + info.name + "' comes before the eviction method whose budget it splits "
                        "(" + info.name + "+" + example_eviction_spec() + ")");
  }
  // Heads of their own (an allocation method, or an eviction method that makes them) are
  // held by the fp32 store and the storage methods that split their heads.
  const MethodInfo* ragged = ragged_component(seen);
  if (ragged && info.kind == MethodKind::Storage && !info.splits_heads) {
    fail_spec(text, "'" + ragged->name + "' leaves each KV head its own count, which only the "
                        "fp32 store and " + head_splitting_methods() + " hold; '" + info.name +
                        "' cannot store it");
  }
  const bool evicts = info.kind == MethodKind::Eviction || seen.count(MethodKind::Eviction);
  const bool retrieves = info.kind == MethodKind::Retrieval || seen.count(MethodKind::Retrieval);
  if (evicts && retrieves) {
    fail_spec(text, "retrieval reads pages of the whole cache and cannot follow eviction");
  }
  check_prefill_composition(text, seen, info);
}

}  // namespace

int64_t MethodParams::get_int(const std::string& name) const {
  return std::strtoll(get(name).c_str(), nullptr, 10);
}

double MethodParams::get_float(const std::string& name) const {
  return std::strtod(get(name).c_str(), nullptr);
}

int64_t MethodParams::get_bytes(const std::string& name) const {
  int64_t bytes = 0;
  if (!parse_byte_size(get(name), &bytes)) {
    throw std::logic_error("method parameter '" + name + "' is not a size");
  }
  return bytes;
}

bool parse_byte_size(const std::string& text, int64_t* bytes) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 15) return false;
  const std::string unit = text.substr(digits);
  int shift = 0;
  if (unit == "KB") shift = 10;
  else if (unit == "MB") shift = 20;
  else if (unit == "GB") shift = 30;
  else if (unit == "TB") shift = 40;
  else if (!unit.empty() && unit != "B") return false;
  const int64_t n = std::strtoll(text.substr(0, digits).c_str(), nullptr, 10);
  if (n > (int64_t{1} << (62 - shift))) return false;
  *bytes = n << shift;
  return true;
}

const std::string& MethodParams::get(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) throw std::logic_error("method parameter '" + name + "' has no value");
  return it->second;
}

void MethodParams::set(const std::string& name, const std::string& value, bool given) {
  if (!values_.count(name)) order_.push_back(name);
  values_[name] = value;
  if (given) given_[name] = true;
}

std::string MethodParams::text() const {
  std::string out;
  for (const auto& name : order_) out += (out.empty() ? "" : ",") + name + "=" + values_.at(name);
  return out;
}

ParamInfo int_param(const std::string& name, int64_t default_value, double min, double max,
                    const std::string& help) {
  ParamInfo p;
  p.name = name;
  p.type = ParamType::Int;
  p.default_value = std::to_string(default_value);
  p.min = min;
  p.max = max;
  p.help = help;
  return p;
}

ParamInfo float_param(const std::string& name, const std::string& default_value, double min,
                      double max, const std::string& help) {
  ParamInfo p = int_param(name, 0, min, max, help);
  p.type = ParamType::Float;
  p.default_value = default_value;
  return p;
}

ParamInfo choice_param(const std::string& name, const std::string& default_value,
                       const std::vector<std::string>& choices, const std::string& help) {
  ParamInfo p;
  p.name = name;
  p.type = ParamType::Choice;
  p.default_value = default_value;
  p.choices = choices;
  p.help = help;
  return p;
}

ParamInfo text_param(const std::string& name, const std::string& default_value,
                     const std::string& help) {
  ParamInfo p;
  p.name = name;
  p.type = ParamType::Text;
  p.default_value = default_value;
  p.help = help;
  return p;
}

ParamInfo bytes_param(const std::string& name, const std::string& default_value,
                      const std::string& help) {
  ParamInfo p = text_param(name, default_value, help);
  p.type = ParamType::Bytes;
  return p;
}

const MethodParams* ResolvedSpec::find(MethodKind kind) const {
  for (const auto& [info, params] : components) {
    if (info->kind == kind) return &params;
  }
  return nullptr;
}

namespace {

std::deque<MethodInfo>& registry() {
  static std::deque<MethodInfo> methods;
  return methods;
}

bool valid_method_name(const std::string& name) {
  if (name.empty() || name.size() > 64 || !std::islower(static_cast<unsigned char>(name[0]))) {
    return false;
  }
  return std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::islower(c) || std::isdigit(c) || c == '_';
  });
}

// The factory a method of `kind` must give, or nullptr for kinds a plugin cannot add.
const char* missing_factory(const MethodInfo& m) {
  switch (m.kind) {
    case MethodKind::Eviction: return m.make_policy ? "" : "make_policy";
    case MethodKind::Storage: return m.make_layers ? "" : "make_layers";
    case MethodKind::Retrieval: return m.make_reader ? "" : "make_reader";
    case MethodKind::Allocation: return m.make_allocation ? "" : "make_allocation";
    case MethodKind::Prefill: return m.make_prefill ? "" : "make_prefill";
    default: return nullptr;
  }
}

}  // namespace

const std::deque<MethodInfo>& method_registry() {
  if (registry().empty()) {
    throw std::logic_error("no cache methods are registered: the program's main registers "
                           "kvbench's own first (register_builtin_methods)");
  }
  return registry();
}

namespace {

void add_methods(std::vector<MethodInfo> methods, const std::string& plugin,
                 const std::string& plugin_sha256, bool built_in) {
  std::vector<std::string> names;
  for (const MethodInfo& m : methods) {
    if (!valid_method_name(m.name)) {
      throw InputError("method name '" + m.name +
                       "' is not lower-case letters, digits and '_' starting with a letter");
    }
    if (const MethodInfo* known = registry().empty() ? nullptr : find_method(m.name)) {
      throw InputError("method '" + m.name + "' is already registered (" +
                       (known->plugin.empty() ? "built into kvbench" : "by " + known->plugin) +
                       ")");
    }
    if (std::find(names.begin(), names.end(), m.name) != names.end()) {
      throw InputError("method '" + m.name + "' is registered twice");
    }
    names.push_back(m.name);
    const char* factory = missing_factory(m);
    if (factory == nullptr && !built_in) {
      throw InputError("method '" + m.name +
                       "': a plugin adds eviction, storage, retrieval, allocation or prefill "
                       "methods (full, reuse, tiers and pinning are the session's)");
    }
    if (factory != nullptr && *factory != '\0') {
      throw InputError("method '" + m.name + "' has no " + factory + " for its kind");
    }
    std::vector<std::string> param_names;
    for (const ParamInfo& p : m.params) {
      if (!valid_method_name(p.name)) {
        throw InputError("method '" + m.name + "': parameter name '" + p.name +
                         "' is not lower-case letters, digits and '_'");
      }
      if (std::find(param_names.begin(), param_names.end(), p.name) != param_names.end()) {
        throw InputError("method '" + m.name + "': parameter '" + p.name + "' given twice");
      }
      param_names.push_back(p.name);
    }
  }
  for (MethodInfo& m : methods) {
    m.plugin = plugin;
    m.plugin_sha256 = plugin_sha256;
    registry().push_back(std::move(m));
  }
}

}  // namespace

void register_methods(std::vector<MethodInfo> methods, const std::string& plugin,
                      const std::string& plugin_sha256) {
  if (registry().empty()) {
    throw std::logic_error("plugin " + plugin + " registers before kvbench's own methods");
  }
  add_methods(std::move(methods), plugin, plugin_sha256, false);
}

void register_builtin(std::vector<MethodInfo> methods) {
  if (!registry().empty()) {
    throw std::logic_error("kvbench's own methods are registered twice");
  }
  add_methods(std::move(methods), "", "", true);
}

const MethodInfo* find_method(const std::string& name) {
  for (const auto& m : method_registry()) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

ResolvedSpec resolve_method_spec(const std::string& text) {
  return resolve_method_spec(parse_method_spec(text));
}

ResolvedSpec resolve_method_spec(const MethodSpec& spec) {
  const std::string& text = spec.text;
  ResolvedSpec resolved;
  std::map<MethodKind, const MethodInfo*> seen;
  for (const MethodComponent& component : spec.components) {
    const MethodInfo* info = find_method(component.name);
    if (!info) {
      std::vector<std::string> names;
      bool any_plugin = false;
      for (const auto& m : method_registry()) {
        names.push_back(m.name);
        any_plugin = any_plugin || !m.plugin.empty();
      }
      // A method of the user's own is most often a plugin that was not given.
      fail_spec(text, "unknown method '" + component.name + "': not built in" +
                          (any_plugin ? " nor in the plugins loaded"
                                      : ", and no plugin was loaded (--plugin FILE, or the "
                                        "config's \"plugins\")") +
                          " (methods: " + join_names(names) + ")");
    }
    MethodParams params;
    for (const auto& [key, value] : component.params) {
      const ParamInfo* p = nullptr;
      for (const auto& candidate : info->params) {
        if (candidate.name == key) p = &candidate;
      }
      if (!p) {
        std::vector<std::string> names;
        for (const auto& candidate : info->params) names.push_back(candidate.name);
        fail_spec(text, "method '" + info->name + "' has no parameter '" + key + "' (" +
                            (names.empty() ? "it takes none" : "parameters: " + join_names(names)) +
                            ")");
      }
      const std::string why = check_value(*p, value);
      if (!why.empty())
        fail_spec(text, info->name + " " + key + "=" + value + ": " + key + " " + why);
    }
    // Registry order, so the canonical text does not depend on the order written.
    const auto replaced = [&](const std::string& name) {
      for (const auto& q : info->params) {
        for (const auto& given : component.params) {
          if (given.first == q.name && q.replaces == name) return true;
        }
      }
      return false;
    };
    for (const auto& p : info->params) {
      for (const auto& [key, value] : component.params) {
        if (key == p.name) params.set(key, value, true);
      }
      if (!params.has(p.name) && !p.default_value.empty() && !replaced(p.name)) {
        params.set(p.name, p.default_value, false);
      }
    }
    if (info->check) {
      try {
        info->check(params);
      } catch (const InputError& e) {
        fail_spec(text, info->name + ": " + e.what());
      }
    }
    check_composition(text, seen, *info, spec.components.size());
    seen[info->kind] = info;
    resolved.components.emplace_back(info, std::move(params));
  }
  const MethodInfo* reuse = seen.count(MethodKind::Reuse) ? seen[MethodKind::Reuse] : nullptr;
  const bool blocks = reuse && reuse->reuses_blocks;
  if (seen.count(MethodKind::Tiers) && !blocks) {
    fail_spec(text, "'" + seen[MethodKind::Tiers]->name + "' says where reused blocks are "
                        "stored and needs a reuse method that keeps blocks (" +
                        block_reuse_methods() + ")");
  }
  if (seen.count(MethodKind::Pinning) && !blocks) {
    fail_spec(text, "'" + seen[MethodKind::Pinning]->name + "' pins what block reuse stores "
                        "between requests and needs a reuse method that keeps blocks (" +
                        block_reuse_methods() + ")");
  }
  if (seen.count(MethodKind::Allocation) && !seen.count(MethodKind::Eviction)) {
    fail_spec(text, "'" + seen[MethodKind::Allocation]->name + "' splits the budget of an "
                        "eviction method: give one after it (" +
                        seen[MethodKind::Allocation]->name + "+" + example_eviction_spec() +
                        "; those that "
                        "take one: " + allocating_methods() + ")");
  }
  const auto storage = seen.find(MethodKind::Storage);
  if (storage != seen.end() && storage->second->needs_eviction &&
      !seen.count(MethodKind::Eviction)) {
    fail_spec(text, "'" + storage->second->name + "' keeps at low precision what an eviction "
                        "method in front drops: give one before it (" +
                        example_eviction_spec() + "+" + storage->second->name + ")");
  }
  if (reuse && seen.count(MethodKind::Eviction)) {
    if (!blocks) {
      fail_spec(text, "'" + reuse->name + "' recomputes tokens into a context an eviction "
                      "method has not seen; it composes with full, storage and retrieval caches");
    }
    const MethodParams* tiers = resolved.find(MethodKind::Tiers);
    if (tiers) {
      for (const std::string& lower : seen[MethodKind::Tiers]->uncompressed_tiers) {
        if (!tiers->given(lower)) continue;
        fail_spec(text, "with an eviction method the compressed context is reused whole from "
                        "device memory; the '" + lower + "' tier holds uncompressed blocks only");
      }
    }
  }
  for (const auto& [info, params] : resolved.components) {
    resolved.canonical += (resolved.canonical.empty() ? "" : "+") + component_text(*info, params);
  }
  return resolved;
}

std::string component_text(const MethodInfo& info, const MethodParams& params) {
  const std::string p = params.text();
  return info.name + (p.empty() ? "" : ":" + p);
}

const ResolvedSpec& full_cache_spec() {
  static const ResolvedSpec full = [] {
    for (const MethodInfo& info : method_registry()) {
      if (info.kind == MethodKind::Full) return resolve_method_spec(info.name);
    }
    throw std::logic_error("no full cache among the registered methods");
  }();
  return full;
}

bool runs_on_cuda(const MethodInfo& info) {
  if (info.propagates_tokens) return false;
  switch (info.kind) {
    case MethodKind::Reuse:
    case MethodKind::Tiers:
    case MethodKind::Pinning: return false;
    case MethodKind::Storage: return static_cast<bool>(info.make_device_layers);
    default: return true;
  }
}

bool makes_ragged_heads(const MethodInfo& info) {
  return info.kind == MethodKind::Allocation ||
         (info.kind == MethodKind::Eviction && info.ragged_heads);
}

CacheParts make_cache_parts(const ResolvedSpec& spec, const KvShape& shape) {
  CacheParts parts;
  bool ragged = false;  // then a storage method's stores hold their heads apart
  for (const auto& component : spec.components) {
    ragged = ragged || makes_ragged_heads(*component.first);
  }
  std::shared_ptr<const HeadAllocation> allocation;  // comes before its eviction method
  for (const auto& [info, params] : spec.components) {
    if (info->kind == MethodKind::Allocation) allocation = info->make_allocation(params);
    if (info->kind == MethodKind::Eviction) {
      parts.policy = allocation ? info->make_allocated_policy(params, shape, allocation)
                                : info->make_policy(params, shape);
    }
    if (info->kind == MethodKind::Retrieval) parts.reader = info->make_reader(params, shape);
    if (info->kind == MethodKind::Prefill) parts.prefill = info->make_prefill(params);
    if (info->kind == MethodKind::Storage) {
      parts.layers = info->make_layers(params, shape);
      if (ragged) {
        parts.layers = split_heads_on_ragged_plans(std::move(parts.layers), shape.n_kv_heads,
                                                   shape.head_dim);
      }
      if (info->make_policy) parts.policy = info->make_policy(params, shape);  // ZipCache's
    }
  }
  return parts;
}

KvCache make_cache(const ResolvedSpec& spec, const KvShape& shape) {
  CacheParts parts = make_cache_parts(spec, shape);
  if (parts.layers.empty()) parts.layers = make_dense_layers(shape);
  KvCache cache(shape, std::move(parts.layers), std::move(parts.policy), std::move(parts.reader));
  cache.set_prefill_attention(std::move(parts.prefill));
  return cache;
}

KvCache make_cache(const std::string& spec, const KvShape& shape) {
  return make_cache(resolve_method_spec(spec), shape);
}

}  // namespace kvbench
