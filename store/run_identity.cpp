#include "store/run_identity.h"

#include <nlohmann/json.hpp>

#include <map>

namespace kvbench {
namespace {

using nlohmann::json;

// A config's plugins by sha256 (-> the file it was loaded from), taken out of `root`.
std::map<std::string, std::string> take_plugins(json& root) {
  std::map<std::string, std::string> plugins;
  if (!root.is_object() || !root.contains("plugins")) return plugins;
  const json list = root["plugins"];
  root.erase("plugins");
  if (!list.is_array()) return {{"(unreadable plugin list)", ""}};
  for (const json& p : list) {
    const json sha = p.is_object() ? p.value("sha256", json()) : json();
    const json file = p.is_object() ? p.value("file", json()) : json();
    plugins[sha.is_string() ? sha.get<std::string>() : p.dump()] =
        file.is_string() ? file.get<std::string>() : "";
  }
  return plugins;
}

std::string short_sha(const std::string& sha) { return sha.substr(0, 12); }

}  // namespace

std::string run_config_difference(const std::string& a, const std::string& b) {
  if (a == b) return "";
  json ja = json::parse(a, nullptr, false), jb = json::parse(b, nullptr, false);
  if (ja.is_discarded() || jb.is_discarded()) return "config";
  const auto pa = take_plugins(ja), pb = take_plugins(jb);
  if (ja != jb) return "config";
  std::map<std::string, std::string> only_a, only_b;
  for (const auto& [sha, file] : pa) {
    if (!pb.count(sha)) only_a[sha] = file;
  }
  for (const auto& [sha, file] : pb) {
    if (!pa.count(sha)) only_b[sha] = file;
  }
  if (only_a.empty() && only_b.empty()) return "";  // the same bytes under other file names
  const auto list = [](const std::map<std::string, std::string>& plugins) {
    std::string s;
    for (const auto& [sha, file] : plugins) {
      s += (s.empty() ? "" : ", ") + (file.empty() ? std::string("?") : file) + " sha256 " +
           short_sha(sha);
    }
    return s.empty() ? std::string("none") : s;
  };
  return "plugin (" + list(only_a) + " there, " + list(only_b) +
         " here: a rebuilt plugin is another method)";
}

bool same_apart_from_plugins(const std::string& a, const std::string& b) {
  if (a == b) return true;
  json ja = json::parse(a, nullptr, false), jb = json::parse(b, nullptr, false);
  if (ja.is_discarded() || jb.is_discarded()) return false;
  take_plugins(ja);
  take_plugins(jb);
  return ja == jb;
}

std::set<std::string> run_config_plugins(const std::string& config_json) {
  json root = json::parse(config_json, nullptr, false);
  std::set<std::string> shas;
  if (root.is_discarded()) return shas;
  for (const auto& [sha, file] : take_plugins(root)) shas.insert(sha);
  return shas;
}

}  // namespace kvbench
