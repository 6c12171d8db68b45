// A plugin built for another plugin interface: its entry point answers another version and
// registers nothing (what KVBENCH_PLUGIN does when the versions differ).
#include "cache/plugin_api.h"

extern "C" __attribute__((visibility("default"))) int kvbench_plugin_register(
    int /*host_interface_version*/, kvbench::PluginMethods* /*methods*/) {
  return KVBENCH_PLUGIN_INTERFACE_VERSION + 1;
}
