// Method spec strings: "name:key=value,key=value", components joined by "+" to compose
// ("snapkv:budget=512+kivi:bits=2"). Syntax only (every layer reads it: the store writes a
// spec's parts into columns); cache/registry.h checks names and parameters against what each
// method accepts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvbench {

struct MethodComponent {
  std::string name;
  std::vector<std::pair<std::string, std::string>> params;  // in the order written
};

struct MethodSpec {
  std::string text;  // as given
  std::vector<MethodComponent> components;
};

// Throws InputError naming the spec and the expected form on any syntax error: empty
// spec or component, missing name, "key" without "=value", empty key or value, a key
// given twice, characters outside [A-Za-z0-9_.-] in names and keys.
MethodSpec parse_method_spec(const std::string& text);

// One "key=value" parameter as a spec writes it (a sweep's budget: "ratio=0.25"), checked as
// the spec parser checks its parameters; InputError otherwise.
std::pair<std::string, std::string> parse_method_param(const std::string& item);

// The spec text of `components`, parameters in their order: parse_method_spec's inverse.
std::string method_spec_text(const std::vector<MethodComponent>& components);

// `spec` with `param` added to its component `component` (a sweep's budget given to the
// method that takes it), its text written again.
MethodSpec with_method_param(MethodSpec spec, size_t component,
                             std::pair<std::string, std::string> param);

// What the reports group a spec's rows by, from its syntax (store/results_db.h keeps them in
// columns beside the spec).
struct MethodParts {
  std::string family;  // the method names, joined by '+': "adakv+snapkv"
  std::string series;  // the spec without budget= and ratio=: the same along a budget sweep
  std::optional<int64_t> budget_tokens;  // the first budget=, if 15 digits at most
};
MethodParts method_parts(const MethodSpec& spec);

// The form every spec error message quotes.
extern const char* const kSpecForm;

// Throws the InputError every spec problem raises: "bad method spec '<spec>': <what>;
// expected <kSpecForm>" (the parser's syntax errors and the registry's checks alike).
[[noreturn]] void fail_spec(const std::string& spec, const std::string& what);

}  // namespace kvbench
