// Whether two runs' recorded configs (RunRecord::config_json) are one sweep: a resume and a
// merge join only those. A plugin counts by its bytes (the sha256 the config records), not
// by the file it was loaded from: the same library copied or renamed is the same method.
#pragma once

#include <set>
#include <string>

namespace kvbench {

// "" when `a` and `b` are the same sweep; otherwise what differs, for an error line: which
// plugin's bytes changed (file and sha256 on each side), or "config" for anything else.
std::string run_config_difference(const std::string& a, const std::string& b);

// Whether `a` and `b` are the same config apart from their plugins (which may differ or not).
bool same_apart_from_plugins(const std::string& a, const std::string& b);

// The sha256 of every plugin a config records (RunRecord::config_json).
std::set<std::string> run_config_plugins(const std::string& config_json);

}  // namespace kvbench
