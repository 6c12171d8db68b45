// While a sweep's units run a plugin's methods: a failure inside the plugin's code (an
// exception of its own, or exit()) becomes one line naming the plugin and its methods, exit 2,
// instead of "internal error" (exit 3) or exit 0 with units missing. What a process cannot
// catch: _exit(), a crash, abort(); it dies of them as such. Nothing half written reaches the
// db in any case: a unit is written in one transaction once it is whole.
#pragma once

#include <string>
#include <vector>

#include "cache/registry.h"

namespace kvbench {

class PluginGuard {
 public:
  // Watches while it lives, where one of `specs` comes from a plugin; else does nothing.
  explicit PluginGuard(const std::vector<ResolvedSpec>& specs);
  ~PluginGuard();
  PluginGuard(const PluginGuard&) = delete;
  PluginGuard& operator=(const PluginGuard&) = delete;

  // A failure of the watched units, `what` its message: an InputError naming the plugins and
  // their methods where there are any; std::runtime_error(what) otherwise.
  [[noreturn]] void fail(const std::string& what) const;

  // "vnorm (plugin libvnorm.so), ...": the plugins' methods it watches; "" for none.
  const std::string& blame() const { return blame_; }

 private:
  std::string blame_;
};

}  // namespace kvbench
