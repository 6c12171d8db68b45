// The registered methods, in the order `kvbench list methods` prints them. A method that
// is not finished is not listed here.
#include "methods/registry.h"

namespace kvbench {

MethodInfo full_method();

const std::vector<MethodInfo>& method_registry() {
  static const std::vector<MethodInfo> methods = {
      full_method(),
  };
  return methods;
}

}  // namespace kvbench
