// The OpenAI API as `kvbench serve` speaks it: request bodies of /v1/completions and
// /v1/chat/completions read into typed values (every field checked, unknown ones refused),
// and the response, stream chunk and error bodies written back. No HTTP here
// (serve/http_server.h), no model: tokenizing is the caller's.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/model/chat_template.h"
#include "serve/engine.h"

namespace kvbench {

// A request the server refuses: the HTTP status and OpenAI's error object.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, const std::string& message, std::string param = "")
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)) {}
  int status;
  std::string type;   // "invalid_request_error", "not_found_error", "server_error", ...
  std::string param;  // the field at fault, "" for none
};

// {"error": {"message", "type", "param", "code"}}
std::string error_body(const ApiError& error);

enum class Endpoint { Completions, ChatCompletions };

struct ApiRequest {
  Endpoint endpoint = Endpoint::Completions;
  std::string model;                   // "" when not given
  std::string prompt;                  // /v1/completions: text
  std::vector<int32_t> prompt_tokens;  // /v1/completions: token ids instead of text
  std::vector<ChatMessage> messages;   // /v1/chat/completions
  std::optional<int64_t> max_tokens;   // max_tokens or max_completion_tokens
  double temperature = 1.0;            // OpenAI's default; 0 is greedy
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;          // stream_options.include_usage
  bool continuous_usage = false;       // stream_options.continuous_usage_stats (vLLM's):
                                       // usage so far in every chunk
  bool ignore_eos = false;             // an extension of vLLM and llama.cpp: decode to max_tokens
  std::string method;                  // "kvbench": {"method": SPEC}; "" for the server's
};

// Parses and checks a body. Throws ApiError 400 naming the field: not a JSON object, an
// unknown field, a wrong type, a value out of range (temperature outside [0, 2], max_tokens
// below 1, more than 4 stop strings, n other than 1, ...), no prompt or messages.
ApiRequest parse_api_request(const std::string& body, Endpoint endpoint);

// The bodies written back; `id` is "cmpl-N" or "chatcmpl-N", `created` Unix seconds.
struct ResponseHead {
  std::string id;
  int64_t created = 0;
  std::string model;
  Endpoint endpoint = Endpoint::Completions;
};
nlohmann::json usage_json(const SequenceEnd& end);
// The whole answer (stream: false).
std::string response_body(const ResponseHead& head, const std::string& text, const SequenceEnd& end,
                          const std::string& method);
// One server-sent event's data: a piece of text (first: the chat's role too), or the last
// chunk with its finish_reason and usage.
// `usage`: the tokens so far, for stream_options.continuous_usage_stats (else null).
std::string stream_chunk(const ResponseHead& head, const std::string& text, bool first,
                         const nlohmann::json& usage = nullptr);
std::string final_chunk(const ResponseHead& head, const SequenceEnd& end, const std::string& method);
// The usage-only chunk of stream_options.include_usage (choices empty).
std::string usage_chunk(const ResponseHead& head, const SequenceEnd& end);

// JSON text of `value`, invalid UTF-8 replaced (a model's bytes need not be valid).
std::string dump_response(const nlohmann::json& value);

}  // namespace kvbench
