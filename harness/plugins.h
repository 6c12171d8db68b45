// Loading plugins (cache/plugin_api.h): `kvbench --plugin FILE` and a sweep config's
// "plugins". A plugin stays loaded for the life of the process.
#pragma once

#include <string>
#include <vector>

namespace kvbench {

struct LoadedPlugin {
  std::string path;    // as given
  std::string file;    // its file name
  std::string sha256;  // of the file's bytes
  std::vector<std::string> methods;  // the names it registered
};

// Loads the plugin at `path` and registers its methods. Loading the same file again (by
// its bytes) does nothing. Throws InputError "plugin FILE: ..." for a missing or unreadable
// file, one that is not a shared object or whose symbols kvbench lacks, no entry point, an
// interface version other than this kvbench's, a method the registry refuses (a name that
// is taken), or an exception thrown while the plugin registers (then nothing is registered).
void load_plugin(const std::string& path);

// The plugins loaded so far, in loading order.
const std::vector<LoadedPlugin>& loaded_plugins();

}  // namespace kvbench
