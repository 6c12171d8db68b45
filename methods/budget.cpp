#include "methods/budget.h"

#include <algorithm>
#include <cmath>

#include "harness/input_error.h"

namespace kvbench {

int64_t Budget::resolve(int64_t n_context) const {
  if (!is_ratio()) return tokens;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ratio * n_context - 1e-9)));
}

std::vector<ParamInfo> budget_params(int64_t default_tokens) {
  ParamInfo budget;
  budget.name = "budget";
  budget.type = ParamType::Int;
  budget.default_value = std::to_string(default_tokens);
  budget.help = "tokens kept per layer and KV head";
  budget.min = 1;
  ParamInfo ratio;
  ratio.name = "ratio";
  ratio.type = ParamType::Float;
  ratio.help = "fraction of the shared context kept, instead of budget";
  ratio.min = 0;
  ratio.min_exclusive = true;
  ratio.max = 1;
  ratio.replaces = "budget";
  return {budget, ratio};
}

Budget budget_from(const MethodParams& params) {
  Budget b;
  if (params.has("ratio")) {
    b.ratio = params.get_float("ratio");
  } else {
    b.tokens = params.get_int("budget");
  }
  return b;
}

void check_budget(const MethodParams& params) {
  if (params.given("budget") && params.given("ratio")) {
    throw InputError("give budget or ratio, not both");
  }
}

}  // namespace kvbench
