// A user-caused problem with an input (a file, a spec string, a task name); the message
// names the input and what was expected. The CLI prints it as one line and exits 2.
#pragma once

#include <stdexcept>

namespace kvbench {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace kvbench
