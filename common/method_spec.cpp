#include "common/method_spec.h"

#include <set>

#include "common/input_error.h"

namespace kvbench {

const char* const kSpecForm =
    "name:key=value,key=value, joined by '+' to compose (e.g. snapkv:budget=512; see "
    "kvbench list methods)";

void fail_spec(const std::string& spec, const std::string& what) {
  throw InputError("bad method spec '" + spec + "': " + what + "; expected " + kSpecForm);
}

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

bool is_name(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!is_name_char(c)) return false;
  }
  return true;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    parts.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

// "key=value" of `spec`: the pair, or the error naming the spec.
std::pair<std::string, std::string> parse_param(const std::string& spec, const std::string& item) {
  const size_t eq = item.find('=');
  if (eq == std::string::npos) fail_spec(spec, "parameter '" + item + "' has no '=value'");
  std::string key = item.substr(0, eq), value = item.substr(eq + 1);
  if (!is_name(key)) fail_spec(spec, "'" + key + "' is not a parameter name");
  if (value.empty()) fail_spec(spec, "parameter '" + key + "' has no value");
  for (char c : value) {
    // ':' may appear in a value (redis=127.0.0.1:6379): only the first ':' of a component
    // ends its name.
    if (c == '=' || c == ' ' || c == '\t' || c == '\n') {
      fail_spec(spec, "parameter '" + key + "' has a malformed value '" + value + "'");
    }
  }
  return {std::move(key), std::move(value)};
}

}  // namespace

std::pair<std::string, std::string> parse_method_param(const std::string& item) {
  return parse_param(item, item);
}

std::string method_spec_text(const std::vector<MethodComponent>& components) {
  std::string text;
  for (const MethodComponent& c : components) {
    if (!text.empty()) text += "+";
    text += c.name;
    for (size_t i = 0; i < c.params.size(); ++i) {
      text += (i == 0 ? ":" : ",") + c.params[i].first + "=" + c.params[i].second;
    }
  }
  return text;
}

MethodSpec with_method_param(MethodSpec spec, size_t component,
                             std::pair<std::string, std::string> param) {
  spec.components.at(component).params.push_back(std::move(param));
  spec.text = method_spec_text(spec.components);
  return spec;
}

MethodParts method_parts(const MethodSpec& spec) {
  MethodParts parts;
  std::vector<MethodComponent> series;
  bool budget_seen = false;  // the first budget= decides
  for (const MethodComponent& c : spec.components) {
    parts.family += (parts.family.empty() ? "" : "+") + c.name;
    MethodComponent kept{c.name, {}};
    for (const auto& [key, value] : c.params) {
      if (key == "budget" && !budget_seen) {
        budget_seen = true;
        if (value.size() <= 15 && value.find_first_not_of("0123456789") == std::string::npos) {
          parts.budget_tokens = std::stoll(value);
        }
      }
      if (key != "budget" && key != "ratio") kept.params.emplace_back(key, value);
    }
    series.push_back(std::move(kept));
  }
  parts.series = method_spec_text(series);
  return parts;
}

MethodSpec parse_method_spec(const std::string& text) {
  MethodSpec spec;
  spec.text = text;
  if (text.empty()) fail_spec(text, "the spec is empty");
  for (const std::string& part : split(text, '+')) {
    if (part.empty()) fail_spec(text, "empty component around '+'");
    MethodComponent component;
    const size_t colon = part.find(':');
    component.name = part.substr(0, colon);
    if (component.name.empty()) fail_spec(text, "a component has no method name");
    if (!is_name(component.name)) fail_spec(text, "'" + component.name + "' is not a method name");
    if (colon != std::string::npos) {
      const std::string params = part.substr(colon + 1);
      if (params.empty()) fail_spec(text, "no parameters after '" + component.name + ":'");
      std::set<std::string> seen;
      for (const std::string& item : split(params, ',')) {
        if (item.empty()) fail_spec(text, "empty parameter in '" + part + "'");
        auto param = parse_param(text, item);
        if (!seen.insert(param.first).second) {
          fail_spec(text, "parameter '" + param.first + "' is given twice");
        }
        component.params.push_back(std::move(param));
      }
    }
    spec.components.push_back(std::move(component));
  }
  return spec;
}

}  // namespace kvbench
