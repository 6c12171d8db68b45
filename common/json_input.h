// JSON read from a user's file (a sweep config, a baseline, a sample line, a calibration):
// nesting is bounded while parsing, so that hostile input cannot overflow the stack later
// in a recursive dump() or walk. Header-only: nlohmann/json is already header-only.
#pragma once

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "common/input_error.h"

namespace kvbench {

// No kvbench file nests more than a few levels; 64 leaves room for any sane hand edit.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`; InputError naming `source` for malformed JSON, a number out of double's
// range (1e400: nlohmann's out_of_range, not a parse_error), nesting deeper than
// kMaxJsonDepth, or a key given twice in one object.
inline nlohmann::json parse_json_input(const std::string& text, const std::string& source) {
  using nlohmann::json;
  // The keys of each open object: a key given twice is refused (nlohmann keeps the last,
  // so a hand edit that repeats a key would silently win or lose).
  std::vector<std::set<std::string>> keys;
  const json::parser_callback_t bounded = [&source, &keys](int depth, json::parse_event_t event,
                                                           json& parsed) {
    if (depth >= kMaxJsonDepth &&
        (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start)) {
      throw InputError(source + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                       " levels");
    }
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.empty() &&
               !keys.back().insert(parsed.get<std::string>()).second) {
      throw InputError(source + ": JSON key \"" + one_line(parsed.get<std::string>()) +
                       "\" given twice in one object");
    }
    return true;
  };
  try {
    return json::parse(text, bounded);
  } catch (const json::exception& e) {  // parse_error, out_of_range
    // nlohmann's message: "[json.exception.parse_error.101] parse error at line 1, ...".
    std::string what = e.what();
    const size_t bracket = what.find("] ");
    if (bracket != std::string::npos) what = what.substr(bracket + 2);
    if (what.size() > 200) what = what.substr(0, 200) + "...";
    throw InputError(source + ": malformed JSON (" + what + ")");
  }
}

// Strings from input files or arguments may not be UTF-8; dump() would throw on them.
// Stored and shown JSON replaces invalid bytes with U+FFFD instead.
inline std::string dump_json(const nlohmann::json& value, int indent = -1) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace kvbench
