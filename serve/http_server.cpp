#include "serve/http_server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <random>

#include "cache/registry.h"
#include "common/input_error.h"
#include "harness/model/gguf.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "harness/model_cache.h"
#include "reuse/prefix_cache.h"
#include "serve/engine.h"
#include "serve/openai_api.h"

namespace kvbench {

namespace {

using namespace std::chrono_literals;

constexpr const char* kJson = "application/json";

// Tokens a chat answer may take when the request gives no max_tokens (OpenAI's completions
// default is 16; a chat's is "the rest of the context", which here would reserve it all).
constexpr int64_t kDefaultChatTokens = 512;
constexpr int64_t kDefaultCompletionTokens = 16;

// Why a method cannot be served, or "" when it can.
std::string unservable(const ResolvedSpec& spec, const LlamaModel& model) {
  const bool reuse = spec.find(MethodKind::Reuse) != nullptr;
  if (reuse && !prefix_reuse_config(spec)) {
    return "only prefix reuse is served (CacheBlend's documents are a session's)";
  }
  if (reuse && spec.find(MethodKind::Eviction)) {
    return "prefix reuse with an eviction method is not served (a loaded block skips the "
           "prefill queries eviction scores)";
  }
  for (const auto& [info, params] : spec.components) {
    if (info->propagates_tokens) {
      return info->name + " runs a prefill of its own (token-selective propagation), not "
             "the server's chunked one";
    }
    if (info->needs_head_retrieval && model.kv_shape().head_retrieval.empty()) {
      return info->name + " needs the model's heads probed: start the server with --method " +
             info->name;
    }
  }
  return "";
}

}  // namespace

struct HttpServer::Impl {
  const LlamaModel& model;
  ServingEngine& engine;
  ServerOptions options;
  httplib::Server server;
  std::shared_ptr<const ResolvedSpec> default_method;
  ChatFormat chat_format = ChatFormat::ChatML;
  std::string default_system;
  std::atomic<int64_t> next_id{0};
  std::atomic<int64_t> in_flight{0};
  // Counts a request in flight while it lives: held by the handler and by the response's
  // content provider, which httplib destroys once the body is written.
  struct InFlight {
    std::atomic<int64_t>& count;
    explicit InFlight(std::atomic<int64_t>& c) : count(c) { ++count; }
    ~InFlight() { --count; }
  };
  std::mt19937_64 seeds{std::random_device{}()};
  std::mutex seeds_mutex;

  Impl(const LlamaModel& m, ServingEngine& e, ServerOptions o)
      : model(m), engine(e), options(std::move(o)) {
    default_method = std::make_shared<const ResolvedSpec>(resolve_method_spec(options.method));
    const std::string why = unservable(*default_method, model);
    if (!why.empty()) throw InputError("--method " + options.method + ": " + why);
    const std::string jinja = model.file().get_string("tokenizer.chat_template", "");
    chat_format = detect_chat_format(jinja);
    default_system = default_system_prompt(jinja);
  }

  static void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(error_body(e), kJson);
  }

  // The engine's request from the API's: tokens, a bounded max_tokens, the method.
  GenerationRequest generation_of(const ApiRequest& api) {
    GenerationRequest g;
    const Tokenizer& tokenizer = model.tokenizer();
    const char* prompt_field = api.endpoint == Endpoint::ChatCompletions ? "messages" : "prompt";
    if (api.endpoint == Endpoint::ChatCompletions) {
      g.prompt = tokenizer.encode(render_chat(chat_format, api.messages, true, default_system));
    } else if (!api.prompt_tokens.empty()) {
      for (int32_t t : api.prompt_tokens) {
        if (t >= model.config().vocab_size) {
          throw ApiError(400, "invalid_request_error",
                         "token id " + std::to_string(t) + " is outside the vocabulary of " +
                             std::to_string(model.config().vocab_size),
                         prompt_field);
        }
      }
      g.prompt = api.prompt_tokens;
    } else {
      g.prompt = tokenizer.encode(api.prompt);
    }
    const int64_t context = model.config().context_length;
    const int64_t n = static_cast<int64_t>(g.prompt.size());
    if (n == 0) throw ApiError(400, "invalid_request_error", "the prompt has no tokens", prompt_field);
    if (n + 1 > context) {
      throw ApiError(400, "invalid_request_error",
                     "the prompt has " + std::to_string(n) + " tokens; the model's context is " +
                         std::to_string(context) + " tokens",
                     prompt_field);
    }
    const int64_t room = context - n;
    if (api.max_tokens && *api.max_tokens > room) {
      throw ApiError(400, "invalid_request_error",
                     "max_tokens " + std::to_string(*api.max_tokens) + " and the prompt's " +
                         std::to_string(n) + " tokens exceed the model's context of " +
                         std::to_string(context) + " tokens",
                     "max_tokens");
    }
    const int64_t fallback = api.endpoint == Endpoint::ChatCompletions ? kDefaultChatTokens
                                                                       : kDefaultCompletionTokens;
    g.max_tokens = static_cast<int32_t>(api.max_tokens ? *api.max_tokens : std::min(room, fallback));
    g.temperature = static_cast<float>(api.temperature);
    if (api.seed) {
      g.seed = *api.seed;
    } else {
      std::lock_guard<std::mutex> lock(seeds_mutex);
      g.seed = seeds();
    }
    g.stop = api.stop;
    g.ignore_eos = api.ignore_eos;
    if (api.method.empty()) {
      g.method = default_method;
    } else {
      try {
        g.method = std::make_shared<const ResolvedSpec>(resolve_method_spec(api.method));
        check_runs_on(*g.method, model.device());
      } catch (const InputError& e) {
        throw ApiError(400, "invalid_request_error", e.what(), "kvbench.method");
      }
      const std::string why = unservable(*g.method, model);
      if (!why.empty()) {
        throw ApiError(400, "invalid_request_error", api.method + ": " + why, "kvbench.method");
      }
    }
    return g;
  }

  void generate(const httplib::Request& req, httplib::Response& res, Endpoint endpoint) {
    const auto guard = std::make_shared<InFlight>(in_flight);
    try {
      const ApiRequest api = parse_api_request(req.body, endpoint);
      if (!api.model.empty() && api.model != options.model_id) {
        throw ApiError(404, "not_found_error",
                       "the model '" + api.model + "' does not exist; this server serves '" +
                           options.model_id + "'",
                       "model");
      }
      GenerationRequest g = generation_of(api);
      const int64_t need = engine.admission_bytes(g);
      if (need > engine.pool_capacity()) {
        throw ApiError(400, "invalid_request_error",
                       "the request's KV cache needs " + std::to_string(need) +
                           " bytes (prompt and max_tokens in its method's store), more than "
                           "the server's pool of " + std::to_string(engine.pool_capacity()),
                       "max_tokens");
      }
      const std::string method = g.method->canonical;
      const int64_t prompt_tokens = static_cast<int64_t>(g.prompt.size());
      std::shared_ptr<SequenceChannel> channel;
      try {
        channel = engine.submit(std::move(g));
      } catch (const ServingEngine::EngineBusy& e) {
        throw ApiError(503, "server_error", e.what());
      }
      const bool chat = endpoint == Endpoint::ChatCompletions;
      const ResponseHead head{(chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++),
                              static_cast<int64_t>(std::time(nullptr)), options.model_id, endpoint};
      if (api.stream) {
        stream(res, channel, head, method, api, prompt_tokens, guard);
      } else {
        answer(res, channel, head, method, guard);
      }
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const InputError& e) {
      send_error(res, ApiError(400, "invalid_request_error", e.what()));
    }
  }

  // stream: true. Server-sent events, one per piece of text, the last with finish_reason and
  // usage, then [DONE]. A comment every second of silence (queued, prefilling) finds a
  // client that left; a failed write cancels the sequence, which frees its cache.
  void stream(httplib::Response& res, std::shared_ptr<SequenceChannel> channel,
              const ResponseHead& head, const std::string& method, const ApiRequest& api,
              int64_t prompt_tokens, std::shared_ptr<InFlight> guard) {
    auto first = std::make_shared<bool>(true);
    const bool include_usage = api.include_usage, continuous = api.continuous_usage;
    res.set_chunked_content_provider(
        "text/event-stream",
        [channel, head, method, include_usage, continuous, prompt_tokens, first,
         guard](size_t, httplib::DataSink& sink) {
          const auto send = [&](const std::string& data) {
            const std::string event = "data: " + data + "\n\n";
            return sink.write(event.data(), event.size());
          };
          SequenceChannel::Update u;
          auto quiet_since = std::chrono::steady_clock::now();
          while (!channel->next(&u, 100ms)) {
            if (std::chrono::steady_clock::now() - quiet_since > 1s) {
              static const std::string ping = ": waiting\n\n";
              if (!sink.write(ping.data(), ping.size())) return channel->cancel(), false;
              quiet_since = std::chrono::steady_clock::now();
            }
          }
          if (!u.text.empty()) {
            const nlohmann::json usage =
                continuous ? nlohmann::json{{"prompt_tokens", prompt_tokens},
                                            {"completion_tokens", u.tokens},
                                            {"total_tokens", prompt_tokens + u.tokens}}
                           : nlohmann::json(nullptr);
            if (!send(stream_chunk(head, u.text, *first, usage))) return channel->cancel(), false;
            *first = false;
          }
          if (!u.end) return true;
          if (!u.end->error.empty()) {
            send(error_body(ApiError(500, "server_error", u.end->error)));
          } else {
            if (u.end->finish_reason == "cancelled") {
              send(error_body(ApiError(503, "server_error", "the server stopped the request")));
            } else {
              send(final_chunk(head, *u.end, method));
              if (include_usage) send(usage_chunk(head, *u.end));
            }
          }
          send("[DONE]");
          sink.done();
          return true;
        },
        [channel](bool success) {
          if (!success) channel->cancel();
        });
  }

  // stream: false. The answer within a second is sent whole with its status; a longer one is
  // sent chunked behind a space a second (JSON allows leading whitespace), so that a client
  // that leaves is noticed and its sequence cancelled.
  void answer(httplib::Response& res, std::shared_ptr<SequenceChannel> channel,
              const ResponseHead& head, const std::string& method,
              std::shared_ptr<InFlight> guard) {
    auto text = std::make_shared<std::string>();
    SequenceChannel::Update u;
    const auto deadline = std::chrono::steady_clock::now() + 1s;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!channel->next(&u, 100ms)) continue;
      *text += u.text;
      if (!u.end) continue;
      if (!u.end->error.empty()) {
        send_error(res, ApiError(500, "server_error", u.end->error));
      } else if (u.end->finish_reason == "cancelled") {
        send_error(res, ApiError(503, "server_error", "the server stopped the request"));
      } else {
        res.set_content(response_body(head, *text, *u.end, method), kJson);
      }
      return;
    }
    // Not "application/json" exactly: httplib would compress it for a client that accepts
    // that, and a compressor holds the spaces back (and 0.11's chunked one garbles the body).
    res.set_chunked_content_provider(
        "application/json; charset=utf-8",
        [channel, head, method, text, guard](size_t, httplib::DataSink& sink) {
          SequenceChannel::Update u;
          while (true) {
            const auto until = std::chrono::steady_clock::now() + 1s;
            bool got = false;
            while (!got && std::chrono::steady_clock::now() < until) got = channel->next(&u, 100ms);
            if (!got) {
              if (!sink.write(" ", 1)) return channel->cancel(), false;
              continue;
            }
            *text += u.text;
            if (u.end) break;
          }
          std::string body;
          if (!u.end->error.empty()) {
            body = error_body(ApiError(500, "server_error", u.end->error));
          } else if (u.end->finish_reason == "cancelled") {
            body = error_body(ApiError(503, "server_error", "the server stopped the request"));
          } else {
            body = response_body(head, *text, *u.end, method);
          }
          sink.write(body.data(), body.size());
          sink.done();
          return true;
        },
        [channel](bool success) {
          if (!success) channel->cancel();
        });
  }

  std::string metrics_text() const {
    const EngineMetrics m = engine.metrics();
    std::string out;
    const auto metric = [&](const char* name, const char* type, const char* help, double value) {
      char line[64];
      std::snprintf(line, sizeof line, "%.17g", value);
      out += std::string("# HELP kvbench_") + name + " " + help + "\n# TYPE kvbench_" + name +
             " " + type + "\nkvbench_" + name + " " + line + "\n";
    };
    metric("running_sequences", "gauge", "Sequences admitted and running (prefill or decode).",
           m.running);
    metric("prefilling_sequences", "gauge", "Running sequences still prefilling their prompt.",
           m.prefilling);
    metric("queued_sequences", "gauge", "Requests waiting for room in the pool.", m.waiting);
    metric("kv_pool_capacity_bytes", "gauge", "The KV memory pool's size.", m.pool_capacity);
    metric("kv_pool_reserved_bytes", "gauge",
           "Bytes reserved by the running sequences and prefix reuse's top tier.", m.pool_reserved);
    metric("kv_pool_free_bytes", "gauge", "Capacity less the reserved bytes.",
           static_cast<double>(m.pool_capacity - m.pool_reserved));
    metric("kv_pool_resident_bytes", "gauge", "Bytes the running sequences' stores hold now.",
           m.pool_resident);
    metric("prefix_cache_bytes", "gauge", "Bytes prefix reuse's tiers hold.", m.prefix_bytes);
    metric("prefix_hit_tokens_total", "counter", "Prompt tokens loaded by prefix reuse.",
           m.prefix_hit_tokens);
    metric("prefix_lookup_tokens_total", "counter", "Prompt tokens prefix reuse looked up.",
           m.prefix_lookup_tokens);
    metric("prompt_tokens_total", "counter", "Prompt tokens of finished prefills.", m.prompt_tokens);
    metric("prefilled_tokens_total", "counter", "Prompt tokens run through the model.",
           m.prefilled_tokens);
    metric("generated_tokens_total", "counter", "Tokens generated.", m.generated_tokens);
    metric("requests_finished_total", "counter", "Requests answered whole.", m.requests_finished);
    metric("requests_cancelled_total", "counter", "Requests cancelled (client gone, shutdown).",
           m.requests_cancelled);
    metric("requests_refused_total", "counter", "Requests refused or failed in the engine.",
           m.requests_refused);
    metric("decode_steps_total", "counter", "Batched decode steps.", m.decode_steps);
    metric("decode_rows_total", "counter", "Sequences over all decode steps.", m.decode_rows);
    metric("most_running_sequences", "gauge", "The most sequences ever running at once.",
           m.most_running);
    metric("busy_seconds_total", "counter", "Seconds the engine spent computing.", m.busy_s);
    metric("tokens_per_second", "gauge", "Generated tokens per second over the last 10 s.",
           m.tokens_per_s);
    return out;
  }

  void routes() {
    server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", kJson);
    });
    server.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const nlohmann::json body = {
          {"object", "list"},
          {"data",
           {{{"id", options.model_id},
             {"object", "model"},
             {"created", 0},
             {"owned_by", "kvbench"},
             {"meta",
              {{"n_ctx", model.config().context_length},
               {"method", default_method->canonical},
               {"kv_pool_bytes", engine.pool_capacity()}}}}}}};
      res.set_content(dump_response(body), kJson);
    });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    server.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      generate(req, res, Endpoint::Completions);
    });
    server.Post("/v1/chat/completions",
                [this](const httplib::Request& req, httplib::Response& res) {
                  generate(req, res, Endpoint::ChatCompletions);
                });
    // Statuses httplib sets itself (404, 405, 413, 400 for a malformed request): OpenAI's body.
    server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string message =
          res.status == 404   ? "no route " + req.method + " " + req.path
          : res.status == 413 ? std::string("the request body is too large")
                              : "the request was refused (HTTP " + std::to_string(res.status) + ")";
      res.set_content(error_body(ApiError(res.status, res.status == 404 ? "not_found_error"
                                                                        : "invalid_request_error",
                                          message)),
                      kJson);
    });
    server.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr e) {
          std::string what = "internal error";
          try {
            std::rethrow_exception(e);
          } catch (const std::exception& x) {
            what = x.what();
          } catch (...) {
          }
          send_error(res, ApiError(500, "server_error", what));
        });
  }
};

HttpServer::HttpServer(const LlamaModel& model, ServingEngine& engine, ServerOptions options)
    : impl_(std::make_unique<Impl>(model, engine, std::move(options))) {
  Impl& s = *impl_;
  s.server.set_payload_max_length(static_cast<size_t>(s.options.max_body_bytes));
  // A handler thread per client for the life of its request (streams block in them).
  s.server.new_task_queue = [] { return new httplib::ThreadPool(96); };
  s.routes();
}

HttpServer::~HttpServer() = default;

namespace {

// Debian's cpp-httplib 0.11.4 listens with a backlog of 5, compiled into the library: a burst
// of clients connecting at once (a load generator's first wave) overflows it and some are
// reset. listen() on a listening socket sets a new backlog, so the socket bound to `port` is
// found among this process's descriptors and given the system's largest.
void widen_listen_backlog(int port) {
  for (int fd = 3; fd < 4096; ++fd) {
    int listening = 0;
    socklen_t length = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0 || !listening) continue;
    sockaddr_storage address{};
    socklen_t size = sizeof address;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) continue;
    const int bound = address.ss_family == AF_INET
                          ? ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port)
                      : address.ss_family == AF_INET6
                          ? ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port)
                          : -1;
    if (bound == port) listen(fd, SOMAXCONN);
  }
}

}  // namespace

int HttpServer::bind() {
  Impl& s = *impl_;
  const int port = s.options.port == 0 ? s.server.bind_to_any_port(s.options.host)
                                       : (s.server.bind_to_port(s.options.host, s.options.port)
                                              ? s.options.port
                                              : -1);
  if (port <= 0) {
    throw InputError("--host " + s.options.host + " --port " + std::to_string(s.options.port) +
                     ": cannot listen there (in use, or not an address of this machine)");
  }
  widen_listen_backlog(port);
  return port;
}

void HttpServer::serve() { impl_->server.listen_after_bind(); }

void HttpServer::stop() { impl_->server.stop(); }

int64_t HttpServer::in_flight() const { return impl_->in_flight; }

}  // namespace kvbench
