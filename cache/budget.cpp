#include "cache/budget.h"

#include <algorithm>
#include <cmath>

#include "common/input_error.h"

namespace kvbench {

int64_t Budget::resolve(int64_t n_context) const {
  if (!is_ratio()) return tokens;
  return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ratio * n_context - 1e-9)));
}

std::vector<ParamInfo> budget_params(int64_t default_tokens) {
  ParamInfo ratio =
      float_param("ratio", "", 0, 1, "fraction of the shared context kept, instead of budget");
  ratio.min_exclusive = true;
  ratio.replaces = "budget";
  return {int_param("budget", default_tokens, 1, kMaxTokens, "tokens kept per layer and KV head"),
          ratio};
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

void check_window_in_budget(const MethodParams& params) {
  const Budget budget = budget_from(params);
  const int64_t window = params.get_int("window");
  if (!budget.is_ratio() && budget.tokens < window) {
    throw InputError("budget=" + std::to_string(budget.tokens) + " must be at least window=" +
                     std::to_string(window) + " (the budget includes the window)");
  }
}

}  // namespace kvbench
