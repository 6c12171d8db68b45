// What every fuzz target asserts besides "no crash, no sanitizer report": bad input is an
// InputError with a message (the CLI prints it through one_line), never another exception
// (libFuzzer reports those as crashes: std::terminate), and what parses is sane.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/input_error.h"

// Aborts with a message when a parsed value breaks an invariant the target checks.
#define FUZZ_CHECK(condition)                                                          \
  do {                                                                                 \
    if (!(condition)) {                                                                \
      std::fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #condition, __FILE__,    \
                   __LINE__);                                                          \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)

namespace kvbench::fuzz {

inline void check_input_error(const InputError& e) {
  const std::string message = e.what();
  FUZZ_CHECK(!message.empty());
  FUZZ_CHECK(one_line(message).find('\n') == std::string::npos);
}

}  // namespace kvbench::fuzz
