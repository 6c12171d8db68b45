// A shared object that is not a plugin: no kvbench_plugin_register.
extern "C" __attribute__((visibility("default"))) int not_a_plugin() { return 1; }
