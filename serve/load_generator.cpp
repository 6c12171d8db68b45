#include "serve/load_generator.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/input_error.h"
#include "tasks/task_catalog.h"

namespace kvbench {

using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The chat of turn `t` of a user's session: the context and first question in the first
// message, each earlier turn's gold answer and the next question after it.
json messages_for(const Sample& sample, size_t t) {
  json messages = json::array();
  for (size_t i = 0; i <= t; ++i) {
    const std::string& query = sample.turns[i].input;
    const std::string text =
        i == 0 && !sample.context.empty() ? sample.context + "\n\n" + query : query;
    messages.push_back({{"role", "user"}, {"content", text}});
    if (i < t) messages.push_back({{"role", "assistant"}, {"content", gold_text(sample.turns[i])}});
  }
  return messages;
}

// One streamed chat completion, timed as it arrives.
struct Streamed {
  std::string text;
  int64_t prompt_tokens = 0, output_tokens = 0, cached_tokens = 0;
  int64_t chunks = 0;  // chunks that carried text
  int64_t eos_text_bytes = -1;  // kvbench serve's, under ignore_eos
  double ttft_ms = 0, last_ms = 0, e2e_ms = 0;
  std::string error;
};

Streamed stream_chat(const std::string& host, int port, const json& body, double timeout_s) {
  Streamed out;
  httplib::Client client(host, port);
  client.set_read_timeout(static_cast<time_t>(timeout_s), 0);
  client.set_connection_timeout(10, 0);
  std::string buffer, error_body;
  int status = 0;
  bool done = false;
  const auto start = Clock::now();
  const auto take_event = [&](const std::string& data) {
    if (data == "[DONE]") {
      done = true;
      return;
    }
    const json e = json::parse(data, nullptr, false);
    if (e.is_discarded()) {
      out.error = "a stream event is not JSON";
      return;
    }
    if (e.contains("error")) {
      out.error = e["error"].value("message", e["error"].dump());
      return;
    }
    if (e.contains("usage") && e["usage"].is_object()) {
      const json& u = e["usage"];
      out.prompt_tokens = u.value("prompt_tokens", int64_t{0});
      out.output_tokens = u.value("completion_tokens", int64_t{0});
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object()) {
        out.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", int64_t{0});
      }
    }
    if (e.contains("kvbench") && e["kvbench"].is_object()) {
      const json& k = e["kvbench"];
      if (k.contains("eos_text_bytes") && k["eos_text_bytes"].is_number_integer()) {
        out.eos_text_bytes = k["eos_text_bytes"].get<int64_t>();
      }
    }
    if (e.contains("choices") && e["choices"].is_array() && !e["choices"].empty()) {
      const json& delta = e["choices"][0].value("delta", json::object());
      if (delta.contains("content") && delta["content"].is_string()) {
        const std::string piece = delta["content"].get<std::string>();
        if (!piece.empty()) {
          if (out.chunks == 0) out.ttft_ms = ms_since(start);
          out.last_ms = ms_since(start);
          ++out.chunks;
          out.text += piece;
        }
      }
    }
  };
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    if (status != 200) {
      if (error_body.size() < 4096) error_body.append(data, std::min<size_t>(size, 4096));
      return true;
    }
    buffer.append(data, size);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) == 0) take_event(event.substr(6));
    }
    return true;
  };
  const auto res = client.send(req);
  out.e2e_ms = ms_since(start);
  if (!res) {
    out.error = "no response: " + httplib::to_string(res.error());
  } else if (status != 200) {
    const json e = json::parse(error_body, nullptr, false);
    out.error = "HTTP " + std::to_string(status) + ": " +
                (e.is_object() && e.contains("error") ? e["error"].value("message", error_body)
                                                      : error_body.substr(0, 200));
  } else if (out.error.empty() && !done) {
    out.error = "the stream ended without [DONE]";
  }
  if (out.output_tokens == 0) out.output_tokens = out.chunks;  // a server without usage
  return out;
}

}  // namespace

void parse_endpoint(const std::string& endpoint, std::string* host, int* port) {
  static const std::regex form(R"(http://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:]+\]):([0-9]{1,5})/?)");
  std::smatch m;
  if (!std::regex_match(endpoint, m, form) || std::stoi(m[2]) < 1 || std::stoi(m[2]) > 65535) {
    throw InputError("--endpoint " + endpoint + ": not http://HOST:PORT");
  }
  *host = m[1];
  *port = std::stoi(m[2]);
}

EndpointInfo probe_endpoint(const std::string& endpoint) {
  std::string host;
  int port = 0;
  parse_endpoint(endpoint, &host, &port);
  httplib::Client client(host, port);
  client.set_connection_timeout(10, 0);
  client.set_read_timeout(30, 0);
  const auto res = client.Get("/v1/models");
  if (!res) {
    throw InputError("--endpoint " + endpoint + ": no answer at /v1/models (" +
                     httplib::to_string(res.error()) + ")");
  }
  const json body = json::parse(res->body, nullptr, false);
  if (res->status != 200 || !body.is_object() || !body.contains("data") ||
      !body["data"].is_array() || body["data"].empty() || !body["data"][0].is_object() ||
      !body["data"][0].contains("id") || !body["data"][0]["id"].is_string()) {
    throw InputError("--endpoint " + endpoint + ": /v1/models did not list a model (HTTP " +
                     std::to_string(res->status) + ")");
  }
  EndpointInfo info;
  const json& model = body["data"][0];
  info.model = model["id"].get<std::string>();
  if (model.contains("meta") && model["meta"].is_object()) {
    const json& meta = model["meta"];
    if (meta.contains("kv_pool_bytes") && meta["kv_pool_bytes"].is_number_integer()) {
      info.pool_bytes = meta["kv_pool_bytes"].get<int64_t>();
    }
    if (meta.contains("method") && meta["method"].is_string()) {
      info.method = meta["method"].get<std::string>();
    }
  }
  return info;
}

std::vector<ServingRow> run_load(const std::vector<Sample>& samples, const LoadOptions& options,
                                 const std::function<void(const ServingRow&)>& progress) {
  std::string host;
  int port = 0;
  parse_endpoint(options.endpoint, &host, &port);
  std::vector<std::vector<ServingRow>> by_sample(samples.size());
  std::atomic<size_t> next{0};
  std::mutex progress_mutex;
  const auto start = Clock::now();
  const auto user = [&] {
    for (size_t i = next++; i < samples.size(); i = next++) {
      const Sample& sample = samples[i];
      const int32_t max_tokens =
          options.max_tokens > 0 ? options.max_tokens : max_new_tokens_for(sample);
      for (size_t t = 0; t < sample.turns.size(); ++t) {
        json body = {{"model", options.model},
                     {"messages", messages_for(sample, t)},
                     {"max_tokens", max_tokens},
                     {"temperature", 0},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
        if (!options.method.empty()) body["kvbench"] = {{"method", options.method}};
        if (options.ignore_eos) body["ignore_eos"] = true;
        ServingRow row;
        row.label = options.label;
        row.endpoint = options.endpoint;
        row.method = options.method;
        row.concurrency = options.concurrency;
        row.pool_bytes = options.pool_bytes;
        row.task = sample.task;
        row.sample_id = sample.id;
        row.turn = static_cast<int32_t>(t + 1);
        row.reference = gold_text(sample.turns[t]);
        row.start_s = std::chrono::duration<double>(Clock::now() - start).count();
        const Streamed s = stream_chat(host, port, body, options.timeout_s);
        row.ttft_ms = s.ttft_ms;
        row.e2e_ms = s.e2e_ms;
        row.itl_ms = s.output_tokens > 1 ? (s.last_ms - s.ttft_ms) / (s.output_tokens - 1) : 0;
        row.prompt_tokens = s.prompt_tokens;
        row.output_tokens = s.output_tokens;
        row.cached_tokens = s.cached_tokens;
        row.prediction = s.text;
        row.error = s.error;
        if (s.error.empty()) {  // the answer up to where it would have ended (substr clamps)
          const size_t kept = options.ignore_eos && s.eos_text_bytes >= 0
                                  ? static_cast<size_t>(s.eos_text_bytes)
                                  : std::string::npos;
          row.score = score_turn(sample, sample.turns[t], s.text.substr(0, kept));
        }
        if (progress) {
          std::lock_guard<std::mutex> lock(progress_mutex);
          progress(row);
        }
        by_sample[i].push_back(std::move(row));
      }
    }
  };
  std::vector<std::thread> users;
  for (int32_t c = 0; c < std::max(1, options.concurrency); ++c) users.emplace_back(user);
  for (std::thread& t : users) t.join();
  std::vector<ServingRow> rows;
  for (auto& rs : by_sample) {
    for (ServingRow& r : rs) rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace kvbench
