// The full cache: every token's keys and values in the dense fp32 store (cache/full_cache.h),
// no policy. The reference every other method is measured against.
#include "cache/registry.h"

namespace kvbench {

// Registered as `full` (methods/method_list.cpp).
MethodInfo full_method() {
  MethodInfo m;
  m.name = "full";
  m.kind = MethodKind::Full;
  m.stage = "-";
  m.summary = "every token's keys and values in fp32: the reference for accuracy and fidelity";
  m.paper = "-";
  return m;
}

}  // namespace kvbench
