// kvbench's own methods join the registry the way a plugin's do: a program's main registers
// them first thing (before it loads any plugin), so the seam (cache/) never calls up into
// the methods.
#pragma once

namespace kvbench {

// Registers every built-in method in listing order (methods/method_list.cpp); a second call
// does nothing.
void register_builtin_methods();

}  // namespace kvbench
