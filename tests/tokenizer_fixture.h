// The text of one case of a tokenizer fixture (tests/fixtures/tokenizer_*.json, written by
// scripts/make_tokenizer_fixtures.py): "text", or "hex" for bytes that are not valid UTF-8.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace kvbench::testing {

inline std::string tokenizer_fixture_text(const nlohmann::json& c) {
  if (c.contains("text")) return c.at("text").get<std::string>();
  const std::string hex = c.at("hex").get<std::string>();
  std::string text;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    text += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return text;
}

}  // namespace kvbench::testing
