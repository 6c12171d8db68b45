#include "serve/openai_api.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace kvbench {

using nlohmann::json;

namespace {

ApiError bad(const std::string& message, const std::string& param = "") {
  return ApiError(400, "invalid_request_error", message, param);
}

const char* type_name(const json& v) { return v.type_name(); }

std::string string_field(const json& v, const std::string& name) {
  if (!v.is_string()) throw bad("'" + name + "' must be a string, not " + type_name(v), name);
  return v.get<std::string>();
}

bool bool_field(const json& v, const std::string& name) {
  if (!v.is_boolean()) throw bad("'" + name + "' must be a boolean, not " + type_name(v), name);
  return v.get<bool>();
}

double number_field(const json& v, const std::string& name, double low, double high) {
  if (!v.is_number()) throw bad("'" + name + "' must be a number, not " + type_name(v), name);
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < low || x > high) {
    throw bad("'" + name + "' must be in [" + json(low).dump() + ", " + json(high).dump() + "]",
              name);
  }
  return x;
}

int64_t integer_field(const json& v, const std::string& name, int64_t low, int64_t high) {
  if (!v.is_number_integer()) {
    throw bad("'" + name + "' must be an integer, not " + type_name(v), name);
  }
  const bool outside = v.is_number_unsigned()
                          ? v.get<uint64_t>() > static_cast<uint64_t>(high) ||
                                v.get<uint64_t>() < static_cast<uint64_t>(std::max<int64_t>(low, 0))
                          : v.get<int64_t>() < low || v.get<int64_t>() > high;
  if (outside) {
    throw bad("'" + name + "' must be in [" + std::to_string(low) + ", " + std::to_string(high) +
                  "]",
              name);
  }
  return v.get<int64_t>();
}

// A message's content: a string, or OpenAI's array of {"type": "text", "text": ...} parts.
std::string message_content(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) throw bad("a message's 'content' must be a string or an array of text parts",
                               "messages");
  std::string text;
  for (const json& part : v) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      throw bad("a message's content parts must be {\"type\": \"text\", \"text\": ...}",
                "messages");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

std::string dump_response(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string error_body(const ApiError& error) {
  return dump_response({{"error",
                         {{"message", error.what()},
                          {"type", error.type},
                          {"param", error.param.empty() ? json(nullptr) : json(error.param)},
                          {"code", error.status}}}});
}

ApiRequest parse_api_request(const std::string& body, Endpoint endpoint) {
  json root;
  try {
    root = json::parse(body);
  } catch (const json::exception& e) {  // malformed, or a number past any type's range
    throw bad(std::string("the body is not JSON kvbench can read: ") + e.what());
  }
  if (!root.is_object()) throw bad("the body must be a JSON object");
  ApiRequest r;
  r.endpoint = endpoint;
  const bool chat = endpoint == Endpoint::ChatCompletions;
  // Fields a client may send with their neutral value (what OpenAI's clients and the load
  // generators send): accepted only as that value, since kvbench does not implement them.
  const std::set<std::string> neutral = {"frequency_penalty", "presence_penalty", "logprobs",
                                         "echo", "top_logprobs", "logit_bias", "best_of"};
  for (const auto& [name, value] : root.items()) {
    if (value.is_null() && name != "model" && name != "prompt" && name != "messages") continue;
    if (name == "model") {
      r.model = string_field(value, name);
    } else if (name == "prompt" && !chat) {
      if (value.is_string()) {
        r.prompt = value.get<std::string>();
      } else if (value.is_array() && value.size() == 1 && value[0].is_string()) {
        r.prompt = value[0].get<std::string>();
      } else if (value.is_array() && !value.empty() && value[0].is_number_integer()) {
        for (const json& t : value) r.prompt_tokens.push_back(static_cast<int32_t>(
                                        integer_field(t, "prompt", 0, INT32_MAX)));
      } else {
        throw bad("'prompt' must be a string, an array of one string or an array of token ids",
                  "prompt");
      }
    } else if (name == "messages" && chat) {
      if (!value.is_array() || value.empty()) {
        throw bad("'messages' must be a non-empty array", "messages");
      }
      for (const json& m : value) {
        if (!m.is_object() || !m.contains("role") || !m.contains("content")) {
          throw bad("each message must be an object with 'role' and 'content'", "messages");
        }
        for (const auto& [key, unused] : m.items()) {
          if (key != "role" && key != "content" && key != "name") {
            throw bad("unknown message field '" + key + "'", "messages");
          }
        }
        const std::string role = string_field(m["role"], "messages.role");
        if (role != "system" && role != "user" && role != "assistant") {
          throw bad("message role '" + role + "' is not system, user or assistant", "messages");
        }
        r.messages.push_back({role, message_content(m["content"])});
      }
    } else if (name == "max_tokens" || name == "max_completion_tokens") {
      r.max_tokens = integer_field(value, name, 1, INT64_MAX);
    } else if (name == "temperature") {
      r.temperature = number_field(value, name, 0, 2);
    } else if (name == "top_p") {
      if (number_field(value, name, 0, 1) != 1) {
        throw bad("'top_p' other than 1 is not supported (use temperature)", name);
      }
    } else if (name == "n") {
      if (integer_field(value, name, 1, 1) != 1) throw bad("'n' must be 1", name);
    } else if (name == "seed") {
      if (!value.is_number_integer() || (!value.is_number_unsigned() && value.get<int64_t>() < 0)) {
        throw bad("'seed' must be an integer in [0, 2^64)", name);
      }
      r.seed = value.get<uint64_t>();
    } else if (name == "stop") {
      if (value.is_string()) {
        r.stop.push_back(value.get<std::string>());
      } else if (value.is_array()) {
        for (const json& s : value) r.stop.push_back(string_field(s, name));
      } else {
        throw bad("'stop' must be a string or an array of strings", name);
      }
      if (r.stop.size() > 4) throw bad("'stop' takes at most 4 strings", name);
      for (const std::string& s : r.stop) {
        if (s.empty() || s.size() > 256) throw bad("each stop string must be 1-256 bytes", name);
      }
    } else if (name == "stream") {
      r.stream = bool_field(value, name);
    } else if (name == "stream_options") {
      if (!value.is_object()) throw bad("'stream_options' must be an object", name);
      for (const auto& [key, option] : value.items()) {
        if (key == "include_usage") {
          r.include_usage = bool_field(option, "stream_options.include_usage");
        } else if (key == "continuous_usage_stats") {
          r.continuous_usage = bool_field(option, "stream_options.continuous_usage_stats");
        } else {
          throw bad("unknown stream option '" + key + "'", name);
        }
      }
    } else if (name == "ignore_eos") {
      r.ignore_eos = bool_field(value, name);
    } else if (name == "user") {
      string_field(value, name);
    } else if (name == "kvbench") {
      if (!value.is_object()) throw bad("'kvbench' must be an object", name);
      for (const auto& [key, option] : value.items()) {
        if (key != "method") throw bad("unknown kvbench option '" + key + "'", name);
        r.method = string_field(option, "kvbench.method");
        if (r.method.empty()) throw bad("'kvbench.method' is empty", name);
      }
    } else if (neutral.count(name)) {
      const bool is_neutral = value.is_boolean() ? !value.get<bool>()
                              : value.is_number() ? value.get<double>() == 0 ||
                                                        (name == "best_of" && value == 1)
                              : value.is_object() && value.empty();
      if (!is_neutral) throw bad("'" + name + "' is not supported by kvbench serve", name);
    } else {
      throw bad("unknown field '" + name + "'", name);
    }
  }
  if (!chat && r.prompt.empty() && r.prompt_tokens.empty()) {
    throw bad("'prompt' is required and must not be empty", "prompt");
  }
  if (chat && r.messages.empty()) throw bad("'messages' is required", "messages");
  if (!r.stream && (r.include_usage || r.continuous_usage)) {
    throw bad("'stream_options' is only allowed with stream: true", "stream_options");
  }
  return r;
}

json usage_json(const SequenceEnd& end) {
  return {{"prompt_tokens", end.prompt_tokens},
          {"completion_tokens", end.completion_tokens},
          {"total_tokens", end.prompt_tokens + end.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", end.cached_tokens}}}};
}

namespace {

json base(const ResponseHead& head, bool chunk) {
  const bool chat = head.endpoint == Endpoint::ChatCompletions;
  return {{"id", head.id},
          {"object", chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
          {"created", head.created},
          {"model", head.model}};
}

// What kvbench adds to a finished response: the method, the cache's peak bytes, the times.
// With ignore_eos, where the answer would have ended (SequenceEnd::eos_text_bytes).
json kvbench_json(const SequenceEnd& end, const std::string& method) {
  json j = {{"method", method},
            {"kv_bytes_peak", end.kv_bytes_peak},
            {"ttft_ms", end.ttft_ms},
            {"queue_ms", end.queue_ms}};
  if (end.eos_text_bytes >= 0) j["eos_text_bytes"] = end.eos_text_bytes;
  return j;
}

}  // namespace

std::string response_body(const ResponseHead& head, const std::string& text, const SequenceEnd& end,
                          const std::string& method) {
  json r = base(head, false);
  json choice = {{"index", 0}, {"finish_reason", end.finish_reason}, {"logprobs", nullptr}};
  if (head.endpoint == Endpoint::ChatCompletions) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  r["choices"] = json::array({choice});
  r["usage"] = usage_json(end);
  r["kvbench"] = kvbench_json(end, method);
  return dump_response(r);
}

std::string stream_chunk(const ResponseHead& head, const std::string& text, bool first,
                         const json& usage) {
  json r = base(head, true);
  json choice = {{"index", 0}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
  if (head.endpoint == Endpoint::ChatCompletions) {
    choice["delta"] = first ? json{{"role", "assistant"}, {"content", text}} : json{{"content", text}};
  } else {
    choice["text"] = text;
  }
  r["choices"] = json::array({choice});
  if (!usage.is_null()) r["usage"] = usage;
  return dump_response(r);
}

std::string final_chunk(const ResponseHead& head, const SequenceEnd& end, const std::string& method) {
  json r = base(head, true);
  json choice = {{"index", 0}, {"finish_reason", end.finish_reason}, {"logprobs", nullptr}};
  if (head.endpoint == Endpoint::ChatCompletions) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  r["choices"] = json::array({choice});
  r["usage"] = usage_json(end);
  r["kvbench"] = kvbench_json(end, method);
  return dump_response(r);
}

std::string usage_chunk(const ResponseHead& head, const SequenceEnd& end) {
  json r = base(head, true);
  r["choices"] = json::array();
  r["usage"] = usage_json(end);
  return dump_response(r);
}

}  // namespace kvbench
