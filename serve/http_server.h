// `kvbench serve`'s HTTP side, on cpp-httplib (Debian's libcpp-httplib-dev, as llama.cpp's
// server uses): /v1/models, /v1/completions, /v1/chat/completions (stream: server-sent
// events), /metrics (Prometheus' text format) and /health, in front of a ServingEngine.
// Every refused request gets a 4xx (or 503) with OpenAI's error body; the server goes on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "harness/model/chat_template.h"

namespace kvbench {

class LlamaModel;
class ServingEngine;
struct ResolvedSpec;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                     // 0: any free port (printed)
  std::string model_id;                // what /v1/models lists and requests name
  std::string method = "full";         // the server's method: requests without one get it
  int64_t max_body_bytes = 8 << 20;    // larger bodies: 413
};

class HttpServer {
 public:
  HttpServer(const LlamaModel& model, ServingEngine& engine, ServerOptions options);
  ~HttpServer();
  // Binds; returns the port (the one chosen for port 0). Throws InputError when it cannot.
  int bind();
  // Serves until stop(); then returns once every request in flight has been answered.
  void serve();
  // Stops accepting connections and ends the responses still being written (any thread; a
  // signal watcher's, once the engine has finished and in_flight() is 0).
  void stop();
  // Generation requests whose response is not yet written whole.
  int64_t in_flight() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvbench
