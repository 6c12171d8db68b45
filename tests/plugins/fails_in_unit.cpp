// A method whose code fails inside a unit, for the test that such a failure names the plugin
// and the method (exit 2) and writes nothing of the unit: `failing_reader` reads every token
// and, at its first decode step, does what $KVBENCH_TEST_PLUGIN_FAILURE says: "throw" (a
// std::runtime_error), "throw42" (an int), "exit" (exit(0)); nothing when unset.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "cache/plugin_api.h"
#include "cache/read_policy.h"

namespace {

class FailingReader : public kvbench::ReadPolicy {
 public:
  std::unique_ptr<kvbench::ReadPolicy> clone() const override {
    return std::make_unique<FailingReader>(*this);
  }
  void appended(int32_t, const float*, int64_t, int64_t) override {}
  const kvbench::PageSelection* select(int32_t, const kvbench::AttentionQuery&, int64_t,
                                       int64_t*) override {
    const char* how = std::getenv("KVBENCH_TEST_PLUGIN_FAILURE");
    if (how == nullptr) return nullptr;
    if (std::strcmp(how, "throw") == 0) throw std::runtime_error("the reader broke");
    if (std::strcmp(how, "throw42") == 0) throw 42;
    if (std::strcmp(how, "exit") == 0) std::exit(0);
    return nullptr;
  }
  int64_t bytes_resident(int32_t) const override { return 0; }
};

void register_methods(kvbench::PluginMethods& methods) {
  kvbench::MethodInfo m;
  m.name = "failing_reader";
  m.kind = kvbench::MethodKind::Retrieval;
  m.stage = "decode";
  m.summary = "reads every token, failing at the first decode step as told (a test)";
  m.paper = "none: the test of failures inside a plugin";
  m.make_reader = [](const kvbench::MethodParams&, const kvbench::KvShape&) {
    return std::unique_ptr<kvbench::ReadPolicy>(std::make_unique<FailingReader>());
  };
  methods.add(m);
}

}  // namespace

KVBENCH_PLUGIN(register_methods)
