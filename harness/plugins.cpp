#include "harness/plugins.h"

#include <dlfcn.h>

#include <exception>
#include <filesystem>
#include <utility>

#include "cache/plugin_api.h"
#include "cache/registry.h"
#include "common/input_error.h"
#include "common/sha256.h"

namespace kvbench {
namespace {

std::vector<LoadedPlugin>& plugins() {
  static std::vector<LoadedPlugin> loaded;
  return loaded;
}

}  // namespace

const std::vector<LoadedPlugin>& loaded_plugins() { return plugins(); }

void load_plugin(const std::string& path) {
  const std::string who = "plugin " + path + ": ";
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError(who + (std::filesystem::exists(path, ec) ? "not a regular file"
                                                               : "no such file"));
  }
  LoadedPlugin plugin;
  plugin.path = path;
  plugin.file = std::filesystem::path(path).filename().string();
  try {
    plugin.sha256 = sha256_file(path);
  } catch (const std::exception& e) {
    throw InputError(who + "cannot be read (" + e.what() + ")");
  }
  for (const LoadedPlugin& p : plugins()) {
    if (p.sha256 == plugin.sha256) return;  // the same bytes, already loaded
  }
  // dlopen wants a path with a slash for a file here, not a library search.
  const std::string open_path = path.find('/') == std::string::npos ? "./" + path : path;
  void* handle = dlopen(open_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    throw InputError(who + "not a loadable shared object (" + (why ? why : "dlopen failed") +
                     ")");
  }
  // Never closed: the registered methods' code lives in it.
  const auto entry = reinterpret_cast<KvbenchPluginEntry>(dlsym(handle, KVBENCH_PLUGIN_ENTRY_POINT));
  if (entry == nullptr) {
    throw InputError(who + "no entry point " KVBENCH_PLUGIN_ENTRY_POINT
                           " (a plugin defines it with KVBENCH_PLUGIN, cache/plugin_api.h)");
  }
  PluginMethods methods;
  int version = 0;
  try {
    version = entry(KVBENCH_PLUGIN_INTERFACE_VERSION, &methods);
  } catch (const std::exception& e) {
    throw InputError(who + "registration failed: " + e.what());
  } catch (...) {
    throw InputError(who + "registration failed with an exception that is not std::exception");
  }
  if (version != KVBENCH_PLUGIN_INTERFACE_VERSION) {
    throw InputError(who + "built for plugin interface version " + std::to_string(version) +
                     ", this kvbench has version " +
                     std::to_string(KVBENCH_PLUGIN_INTERFACE_VERSION) + "; rebuild it");
  }
  for (const MethodInfo& m : methods.methods()) plugin.methods.push_back(m.name);
  try {
    register_methods(std::move(methods.methods()), plugin.file, plugin.sha256);
  } catch (const InputError& e) {
    throw InputError(who + e.what());
  }
  plugins().push_back(std::move(plugin));
}

}  // namespace kvbench
