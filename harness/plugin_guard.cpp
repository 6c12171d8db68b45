#include "harness/plugin_guard.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "cache/registry.h"
#include "common/input_error.h"

namespace kvbench {

namespace {

// The guard of the units running now; read by the exit handler.
const PluginGuard*& active_guard() {
  static const PluginGuard* guard = nullptr;
  return guard;
}

void on_exit_inside_unit() {
  if (active_guard() == nullptr) return;
  std::fprintf(stderr, "kvbench: error: the process exited inside a unit of %s; the unit was "
                       "not written\n", active_guard()->blame().c_str());
  std::fflush(stderr);
  std::_Exit(2);
}

}  // namespace

PluginGuard::PluginGuard(const std::vector<ResolvedSpec>& specs) {
  for (const ResolvedSpec& spec : specs) {
    for (const auto& [info, params] : spec.components) {
      if (info->plugin.empty()) continue;
      if (!blame_.empty()) blame_ += ", ";
      blame_ += info->name + " (plugin " + info->plugin + ")";
    }
  }
  if (blame_.empty()) return;
  static const bool registered = std::atexit(on_exit_inside_unit) == 0;
  (void)registered;
  active_guard() = this;
}

PluginGuard::~PluginGuard() {
  if (active_guard() == this) active_guard() = nullptr;
}

void PluginGuard::fail(const std::string& what) const {
  if (blame_.empty()) throw std::runtime_error(what);
  throw InputError("a unit of " + blame_ + " failed: " + what + "; it was not written");
}

}  // namespace kvbench
