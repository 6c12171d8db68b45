// A method made slow on purpose, for the speed gate's own test (`kvbench check` must fail a
// method that got slower beside the others). `slow_reader` is a read policy that reads every
// token, as the full cache does, and at each decode step sleeps the milliseconds in
// $KVBENCH_TEST_DECODE_DELAY_MS (none when unset): the same answers and bytes, slower decode.
// It lives in a test plugin so that no kvbench build carries the knob.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>

#include "cache/plugin_api.h"
#include "cache/read_policy.h"

namespace {

class SlowReader : public kvbench::ReadPolicy {
 public:
  explicit SlowReader(double delay_ms) : delay_ms_(delay_ms) {}
  std::unique_ptr<kvbench::ReadPolicy> clone() const override {
    return std::make_unique<SlowReader>(*this);
  }
  void appended(int32_t, const float*, int64_t, int64_t) override {}
  const kvbench::PageSelection* select(int32_t layer, const kvbench::AttentionQuery&, int64_t,
                                       int64_t*) override {
    if (layer == 0 && delay_ms_ > 0) {  // once per decode step
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms_));
    }
    return nullptr;  // every token
  }
  int64_t bytes_resident(int32_t) const override { return 0; }

 private:
  double delay_ms_;
};

void register_methods(kvbench::PluginMethods& methods) {
  kvbench::MethodInfo m;
  m.name = "slow_reader";
  m.kind = kvbench::MethodKind::Retrieval;
  m.stage = "decode";
  m.summary = "reads every token, sleeping $KVBENCH_TEST_DECODE_DELAY_MS per decode step (a test)";
  m.paper = "none: the speed gate's test";
  m.make_reader = [](const kvbench::MethodParams&, const kvbench::KvShape&) {
    const char* delay = std::getenv("KVBENCH_TEST_DECODE_DELAY_MS");
    return std::unique_ptr<kvbench::ReadPolicy>(
        std::make_unique<SlowReader>(delay ? std::atof(delay) : 0.0));
  };
  methods.add(m);
}

}  // namespace

KVBENCH_PLUGIN(register_methods)
