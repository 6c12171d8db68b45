// `kvbench load`: kvbench's shared-context tasks as concurrent multi-round chat sessions
// against any OpenAI-compatible endpoint (LMCache's multi-round QA shape): each user is one
// sample, whose first message carries its context and first question and whose later
// messages ask the later questions, the gold answers appended between them as the sweeps
// append them, so every concurrency level sends the same requests. At most `concurrency`
// sessions are in flight; each request streams, and its client times the first text (TTFT),
// the gaps between tokens and the whole. Answers are scored as the sweeps score them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "datasets/sample.h"
#include "store/results_db.h"

namespace kvbench {

struct LoadOptions {
  std::string endpoint;       // http://host:port (the API under /v1)
  std::string model;          // the API's model name; "" for the endpoint's first
  std::string method;         // sent as {"kvbench": {"method": ...}}; "" sends none
  std::string label;          // the serving row's label
  int32_t concurrency = 1;
  int32_t max_tokens = 0;     // 0: each task's decode budget, as the sweeps use
  // Sends ignore_eos (vLLM's and llama.cpp's field): every answer runs to max_tokens, a
  // load of fixed output lengths. The score reads the text up to where kvbench serve says
  // the answer would have ended (its eos_text_bytes), the whole text from another server.
  bool ignore_eos = false;
  int64_t pool_bytes = 0;     // what the endpoint said of its pool (0: not known)
  double timeout_s = 600;     // a request's read timeout
};

// What an endpoint says of itself at /v1/models: its first model's name and, for kvbench
// serve, its KV pool and method. Throws InputError naming the endpoint when it does not
// answer as an OpenAI server.
struct EndpointInfo {
  std::string model;
  int64_t pool_bytes = 0;
  std::string method;  // "" for another server
};
EndpointInfo probe_endpoint(const std::string& endpoint);

// "http://host:port" -> host and port; throws InputError for anything else.
void parse_endpoint(const std::string& endpoint, std::string* host, int* port);

// Runs every sample's session; returns one row per request (sample order, then turn), the
// start times relative to the first request. `progress` (optional) sees each finished row.
std::vector<ServingRow> run_load(const std::vector<Sample>& samples, const LoadOptions& options,
                                 const std::function<void(const ServingRow&)>& progress = {});

}  // namespace kvbench
