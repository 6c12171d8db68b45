// The tests' main: kvbench's own methods registered, as the program's main does, then Catch.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "methods/builtin_methods.h"

int main(int argc, char** argv) {
  kvbench::register_builtin_methods();
  return Catch::Session().run(argc, argv);
}
