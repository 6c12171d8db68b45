// kvbench serve's request bodies (serve/openai_api.h): anything a client sends is read into
// a request or refused with a 400 ApiError naming what is wrong, never another exception;
// what parses is within the bounds the server relies on.
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "methods/builtin_methods.h"
#include "serve/openai_api.h"

using namespace kvbench;

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  register_builtin_methods();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Endpoint endpoint = data[0] & 1 ? Endpoint::ChatCompletions : Endpoint::Completions;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    const ApiRequest r = parse_api_request(body, endpoint);
    FUZZ_CHECK(!r.max_tokens || *r.max_tokens >= 1);
    FUZZ_CHECK(r.temperature >= 0 && r.temperature <= 2);
    FUZZ_CHECK(r.stop.size() <= 4);
    for (const std::string& s : r.stop) FUZZ_CHECK(!s.empty() && s.size() <= 256);
    if (endpoint == Endpoint::ChatCompletions) {
      FUZZ_CHECK(!r.messages.empty());
    } else {
      FUZZ_CHECK(!r.prompt.empty() || !r.prompt_tokens.empty());
      for (int32_t t : r.prompt_tokens) FUZZ_CHECK(t >= 0);
    }
    // The error body of any refusal is JSON, whatever the message holds.
    FUZZ_CHECK(nlohmann::json::accept(error_body(ApiError(400, "invalid_request_error", body))));
  } catch (const ApiError& e) {
    FUZZ_CHECK(e.status == 400 && !std::string(e.what()).empty());
    FUZZ_CHECK(nlohmann::json::accept(error_body(e)));
  }
  return 0;
}
