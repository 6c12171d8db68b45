// Whether two runs' recorded configs (RunRecord::config_json) are one sweep: a resume and a
// merge join only those. A plugin counts by its bytes (the sha256 the config records), not
// by the file it was loaded from: the same library copied or renamed is the same method.
#pragma once

#include <string>

namespace kvbench {

// "" when `a` and `b` are the same sweep; otherwise what differs, for an error line: which
// plugin's bytes changed (file and sha256 on each side), or "config" for anything else.
std::string run_config_difference(const std::string& a, const std::string& b);

}  // namespace kvbench
