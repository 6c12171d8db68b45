// Serving under load: the batched decode step against each sequence run alone, the OpenAI
// request parser, and `kvbench serve` itself on a free port (concurrent streams, a client
// that leaves, bad requests, SIGTERM), all on tiny random-weight models.
#include <catch2/catch.hpp>

#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/registry.h"
#include "gguf_writer.h"
#include "harness/model/llama_model.h"
#include "serve/kv_pool.h"
#include "serve/openai_api.h"
#include "serve_process.h"

using namespace kvbench;
using nlohmann::json;
using kvbench::testing::post;
using kvbench::testing::Reply;
using kvbench::testing::ServerProcess;

namespace {

// A tiny model slow enough to be caught mid-answer (a few ms a token) and long enough to run
// thousands of tokens.
std::string serving_model_path() {
  static const std::string path = [] {
    const std::string p = testing::temp_path("tiny_serving.gguf");
    testing::TinyLlamaSpec spec;
    spec.n_layer = 4;
    spec.n_embd = 256;
    spec.n_head = 4;
    spec.n_head_kv = 2;
    spec.n_ff = 512;
    spec.context_length = 4096;
    spec.vocab_size = 4096;
    spec.tied_embeddings = false;
    spec.output_std = 1.0f;  // peaked logits: greedy answers do not hinge on rounding
    testing::write_tiny_llama_gguf(p, spec);
    return p;
  }();
  return path;
}

std::vector<int32_t> random_tokens(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(3, vocab - 1);
  std::vector<int32_t> tokens(n);
  for (auto& t : tokens) t = pick(rng);
  return tokens;
}

int32_t argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// Four sequences of different lengths and methods, decoded 12 steps alone (decode()) and in
// one batch (decode_batch()) from the same prefills: every row's logits must be the same.
void check_batch_equals_alone(LlamaModel& model) {
  const std::vector<std::string> methods = {"full", "snapkv:ratio=0.5", "kivi:bits=4",
                                            "quest:page=16,ratio=0.5"};
  const int64_t vocab = model.config().vocab_size;
  std::vector<KvCache> alone, batched;
  std::vector<int32_t> next;
  for (size_t i = 0; i < methods.size(); ++i) {
    const auto prompt = random_tokens(90 + 37 * static_cast<int64_t>(i), 4000, 7 + i);
    for (auto* caches : {&alone, &batched}) {
      caches->push_back(make_cache(methods[i], model.kv_shape()));
      const std::vector<float> logits = model.forward(prompt, caches->back());
      caches->back().end_context();
      if (caches == &alone) next.push_back(argmax(logits.data(), vocab));
    }
  }
  for (int step = 0; step < 12; ++step) {
    std::vector<KvCache*> rows;
    for (KvCache& c : batched) rows.push_back(&c);
    const std::vector<float> together = model.decode_batch(next, rows);
    for (size_t i = 0; i < methods.size(); ++i) {
      INFO(methods[i] << ", step " << step);
      const std::vector<float> one = model.decode(next[i], alone[i]);
      const std::vector<float> row(together.begin() + i * vocab, together.begin() + (i + 1) * vocab);
      CHECK(row == one);  // bit for bit: the bound is 0
      CHECK(batched[i].next_position() == alone[i].next_position());
      CHECK(batched[i].bytes_resident() == alone[i].bytes_resident());
      next[i] = argmax(one.data(), vocab);
    }
  }
}

// `kvbench serve` on a free port, its output read until it says where it listens.
}  // namespace

TEST_CASE("serve: a batched decode step gives each sequence the logits it gets alone", "[unit]") {
  auto model = LlamaModel::load(serving_model_path());
  SECTION("fp32 activations") { check_batch_equals_alone(*model); }
  SECTION("int8 activations") {
    model->set_decode_activations(Activations::Int8);
    check_batch_equals_alone(*model);
  }
}

TEST_CASE("serve: forward_part in chunks leaves the cache forward() leaves", "[unit]") {
  auto model = LlamaModel::load(serving_model_path());
  model->prefill_chunk = 64;
  const auto prompt = random_tokens(300, 4000, 3);
  KvCache whole = make_cache("snapkv:ratio=0.25", model->kv_shape());
  KvCache parts = make_cache("snapkv:ratio=0.25", model->kv_shape());
  const std::vector<float> a = model->forward(prompt, whole);
  std::vector<float> b;
  for (int64_t begin = 0; begin < 300; begin += 128) {
    b = model->forward_part(prompt, begin, std::min<int64_t>(300, begin + 128), parts);
  }
  CHECK(a == b);
  whole.end_context();
  parts.end_context();
  CHECK(whole.bytes_resident() == parts.bytes_resident());
  CHECK(model->decode(5, whole) == model->decode(5, parts));
}

TEST_CASE("serve: a KIVI sequence packed chunk by chunk stays within the bound admission reserves",
          "[unit]") {
  auto model = LlamaModel::load(serving_model_path());
  model->prefill_chunk = 64;
  constexpr int64_t kChunk = 128;
  KvPool pool(int64_t{1} << 30, kChunk);
  const StoreCost kivi = pool.store_cost(*model, resolve_method_spec("kivi:bits=4"));
  CHECK(kivi.settles_chunks);
  CHECK_FALSE(pool.store_cost(*model, resolve_method_spec("full")).settles_chunks);
  // Only with nothing planning on the prompt's fp32 KV.
  CHECK(make_cache("kivi:bits=4", model->kv_shape()).settle_context_chunks());
  CHECK_FALSE(make_cache("full", model->kv_shape()).settle_context_chunks());
  CHECK_FALSE(make_cache("snapkv:ratio=0.5+kivi:bits=4", model->kv_shape()).settle_context_chunks());

  for (const int64_t n : {300, 1500, 3000}) {  // past the probe's 16 chunks too
    const auto prompt = random_tokens(n, 4000, 11);
    constexpr int32_t kAnswer = 300;
    KvCache packed = make_cache("kivi:bits=4", model->kv_shape());
    REQUIRE(packed.settle_context_chunks());
    packed.reserve(n + kAnswer);  // as the engine admits it
    KvCache at_end = make_cache("kivi:bits=4", model->kv_shape());
    const int64_t bound = kivi.whole.at(n + kAnswer);
    for (int64_t begin = 0; begin < n; begin += kChunk) {
      const int64_t end = std::min(n, begin + kChunk);
      model->forward_part(prompt, begin, end, packed);
      model->forward_part(prompt, begin, end, at_end);
    }
    INFO(n << " prompt tokens: peak " << packed.stats().bytes_peak << ", bound " << bound);
    CHECK(packed.stats().bytes_peak <= bound);  // the peak: before each chunk settled
    // Held at fp32 until the end, a long prompt takes over 3x the bytes (4 bits; the fp32
    // residual and the chunk in flight weigh on short ones).
    INFO("fp32 until the end " << at_end.bytes_resident() << ", packed "
                               << packed.bytes_resident());
    if (n >= 1500) CHECK(at_end.bytes_resident() > 3 * packed.bytes_resident());
    packed.end_context();
    at_end.end_context();
    // Packed the same blocks either way.
    CHECK(packed.layer(0).n_tokens() == at_end.layer(0).n_tokens());
    for (int32_t t = 1; t <= kAnswer; ++t) model->decode(5 + t, packed);
    CHECK(packed.stats().bytes_peak <= bound);
    // The bound is tight enough to admit by: within a quarter of what the sequence held.
    CHECK(bound < packed.stats().bytes_peak * 5 / 4 + 64 * 1024);
  }
}

namespace {

// A metric's value from /metrics.
double metric(int port, const std::string& name) {
  httplib::Client client("127.0.0.1", port);
  const auto res = client.Get("/metrics");
  REQUIRE(res);
  const std::string key = "\nkvbench_" + name + " ";
  const size_t at = ("\n" + res->body).find(key);
  REQUIRE(at != std::string::npos);
  return std::stod(("\n" + res->body).substr(at + key.size()));
}

// Waits up to 20 s for a metric to reach `value`.
bool metric_reaches(int port, const std::string& name, double value) {
  for (int i = 0; i < 400; ++i) {
    if (metric(port, name) == value) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The events of a stream: the JSON of every "data:" line but [DONE], which sets *done.
std::vector<json> events_of(const std::string& body, bool* done) {
  std::vector<json> events;
  *done = false;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    if (data == "[DONE]") {
      *done = true;
    } else {
      events.push_back(json::parse(data));
    }
    at = end;
  }
  return events;
}

}  // namespace

TEST_CASE("serve: requests are read as OpenAI's API says, bad ones refused naming the field",
          "[unit]") {
  const ApiRequest chat = parse_api_request(
      R"({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
          "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
          "stop": ["\n"], "seed": 3, "kvbench": {"method": "snapkv:ratio=0.25"}})",
      Endpoint::ChatCompletions);
  CHECK(chat.messages.size() == 1);
  CHECK(*chat.max_tokens == 5);
  CHECK(chat.temperature == 0);
  CHECK(chat.stream);
  CHECK(chat.include_usage);
  CHECK(chat.stop == std::vector<std::string>{"\n"});
  CHECK(*chat.seed == 3);
  CHECK(chat.method == "snapkv:ratio=0.25");
  const ApiRequest tokens = parse_api_request(R"({"prompt": [1, 2, 3]})", Endpoint::Completions);
  CHECK(tokens.prompt_tokens == std::vector<int32_t>{1, 2, 3});
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "not JSON"},
      {R"({"prompt": "x", "temperature": 74e368934814741910})", "not JSON"},
      {"[1]", "JSON object"},
      {R"({"prompt": "x", "colour": 1})", "unknown field 'colour'"},
      {R"({"prompt": 5})", "'prompt'"},
      {R"({"prompt": "x", "max_tokens": "5"})", "'max_tokens' must be an integer"},
      {R"({"prompt": "x", "max_tokens": 0})", "'max_tokens' must be in"},
      {R"({"prompt": "x", "temperature": 3})", "'temperature' must be in"},
      {R"({"prompt": "x", "n": 2})", "'n'"},
      {R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", "at most 4"},
      {R"({"prompt": "x", "seed": -1})", "'seed'"},
      {R"({"prompt": "x", "top_p": 0.5})", "top_p"},
      {R"({"prompt": "x", "logprobs": 5})", "'logprobs' is not supported"},
      {R"({"prompt": "x", "stream_options": {"include_usage": true}})", "only allowed with stream"},
      {R"({"prompt": "x", "kvbench": {"methods": "full"}})", "unknown kvbench option"},
      {R"({})", "'prompt' is required"},
  };
  for (const auto& [body, needle] : bad) {
    INFO(body);
    try {
      parse_api_request(body, Endpoint::Completions);
      FAIL("accepted");
    } catch (const ApiError& e) {
      CHECK(e.status == 400);
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  }
  CHECK_THROWS_AS(parse_api_request(R"({"messages": [{"role": "robot", "content": "x"}]})",
                                    Endpoint::ChatCompletions),
                  ApiError);
  CHECK_THROWS_AS(parse_api_request(R"({"messages": []})", Endpoint::ChatCompletions), ApiError);
}

TEST_CASE("serve: four concurrent streams, a client that leaves, bad requests, SIGTERM", "[unit]") {
  ServerProcess server(serving_model_path(), {"--kv-pool-mib", "64", "--max-seqs", "8", "--grace", "30"});
  const int port = server.port;
  {
    httplib::Client client("127.0.0.1", port);
    const auto models = client.Get("/v1/models");
    REQUIRE(models);
    CHECK(json::parse(models->body)["data"][0]["id"] == "tiny");
  }

  // Four streaming clients at once, each with another method: every one gets its whole answer,
  // the text of its chunks equal to the same request's non-streaming answer (greedy).
  const std::vector<std::string> methods = {"full", "snapkv:ratio=0.5", "kivi:bits=4",
                                            "quest:page=16,ratio=0.5"};
  std::vector<std::string> streamed(4), whole(4);
  std::vector<json> last(4);
  std::vector<bool> done(4);
  const auto body = [&](size_t i, bool stream) {
    return json{{"model", "tiny"},
                {"prompt", "the quick brown fox " + std::to_string(i)},
                {"max_tokens", 40},
                {"temperature", 0},
                {"ignore_eos", true},
                {"stream", stream},
                {"kvbench", {{"method", methods[i]}}}}
        .dump();
  };
  {
    std::vector<std::thread> clients;
    for (size_t i = 0; i < 4; ++i) {
      clients.emplace_back([&, i] {
        httplib::Client client("127.0.0.1", port);
        client.set_read_timeout(60, 0);
        const auto res = client.Post("/v1/completions", body(i, true), "application/json");
        if (!res || res->status != 200) return;
        bool finished = false;
        for (const json& e : events_of(res->body, &finished)) {
          streamed[i] += e["choices"][0]["text"].get<std::string>();
          last[i] = e;
        }
        done[i] = finished;
      });
    }
    for (auto& t : clients) t.join();
  }
  CHECK(metric(port, "most_running_sequences") >= 2);  // they ran together
  for (size_t i = 0; i < 4; ++i) {
    INFO(methods[i]);
    CHECK(done[i]);
    CHECK(last[i]["choices"][0]["finish_reason"] == "length");
    CHECK(last[i]["usage"]["completion_tokens"] == 40);
    CHECK(last[i]["kvbench"]["method"].get<std::string>().rfind(methods[i].substr(0, 4), 0) == 0);
    const Reply r = post(port, "/v1/completions", body(i, false));
    REQUIRE(r.status == 200);
    whole[i] = json::parse(r.body)["choices"][0]["text"];
    CHECK(streamed[i] == whole[i]);
  }

  // Bad requests: each a 4xx with OpenAI's error body, and the server goes on serving.
  const std::vector<std::tuple<std::string, std::string, int>> bad = {
      {"/v1/completions", "{not json", 400},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 1000000000})", 400},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": "ten"})", 400},
      {"/v1/completions", R"({"prompt": "x", "frobnicate": true})", 400},
      {"/v1/completions", R"({"model": "gpt-9", "prompt": "x"})", 404},
      {"/v1/completions", R"({"prompt": "x", "kvbench": {"method": "nosuchmethod"}})", 400},
      {"/v1/completions", R"({"prompt": "x", "kvbench": {"method": "snapkv:ratio=7"}})", 400},
      {"/v1/completions", R"({"prompt": [999999]})", 400},
      {"/v1/completions", R"({"prompt": ")" + std::string(20000, 'a') + R"("})", 400},
      {"/v1/chat/completions", R"({"messages": "hi"})", 400},
      {"/v1/chat/completions", R"({"prompt": "x"})", 400},
      {"/v1/nothing", "{}", 404},
      {"/v1/completions", std::string(9 << 20, ' '), 413},
      {"/v1/completions", R"({"prompt": "x", "kvbench": {"method": "prefix+snapkv"}})", 400},
  };
  for (const auto& [path, request, status] : bad) {
    INFO(path << " " << request.substr(0, 80));
    const Reply r = post(port, path, request);
    CHECK(r.status == status);
    const json error = json::parse(r.body)["error"];
    CHECK(error["message"].is_string());
    CHECK(error["type"].is_string());
  }
  CHECK(post(port, "/v1/completions", body(0, false)).status == 200);  // still serving

  // A client that leaves mid-answer: its sequence is cancelled and its bytes freed.
  {
    httplib::Client client("127.0.0.1", port);
    int chunks = 0;
    const std::string long_body = json{{"prompt", "a long answer"},
                                       {"max_tokens", 3500},
                                       {"ignore_eos", true},
                                       {"temperature", 0},
                                       {"stream", true}}
                                      .dump();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = long_body;
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 5; };
    client.send(req);  // the receiver's false closes the connection
  }
  CHECK(metric_reaches(port, "requests_cancelled_total", 1));
  CHECK(metric_reaches(port, "running_sequences", 0));
  CHECK(metric(port, "kv_pool_reserved_bytes") == 0);
  CHECK(metric(port, "generated_tokens_total") < 4 * 40 * 2 + 40 + 3500);

  // SIGTERM while a stream runs: it is answered whole, new requests are refused, exit 0.
  std::string running;
  std::thread stream([&] {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(60, 0);
    const auto res = client.Post(
        "/v1/completions",
        json{{"prompt", "x"}, {"max_tokens", 300}, {"ignore_eos", true}, {"stream", true}}.dump(),
        "application/json");
    if (res) running = res->body;
  });
  REQUIRE(metric_reaches(port, "running_sequences", 1));
  kill(server.pid, SIGTERM);
  stream.join();
  bool finished = false;
  const std::vector<json> events = events_of(running, &finished);
  CHECK(finished);
  REQUIRE_FALSE(events.empty());
  CHECK(events.back()["choices"][0]["finish_reason"] == "length");
  CHECK(events.back()["usage"]["completion_tokens"] == 300);
  const int code = server.wait_exit();
  INFO(server.log);
  CHECK(code == 0);
  CHECK(server.log.find("SIGTERM") != std::string::npos);
}

TEST_CASE("serve: SIGTERM with no grace ends a running stream with an error event, exit 0",
          "[unit]") {
  ServerProcess server(serving_model_path(), {"--grace", "0"});
  std::string body;
  std::thread stream([&] {
    httplib::Client client("127.0.0.1", server.port);
    client.set_read_timeout(60, 0);
    const auto res = client.Post(
        "/v1/completions",
        json{{"prompt", "x"}, {"max_tokens", 3500}, {"ignore_eos", true}, {"stream", true}}.dump(),
        "application/json");
    if (res) body = res->body;
  });
  REQUIRE(metric_reaches(server.port, "running_sequences", 1));
  kill(server.pid, SIGTERM);
  stream.join();
  bool finished = false;
  const std::vector<json> events = events_of(body, &finished);
  CHECK(finished);
  REQUIRE_FALSE(events.empty());
  CHECK(events.back().contains("error"));
  CHECK(server.wait_exit() == 0);
}

TEST_CASE("serve: admission by real bytes: a pool admits more 4-bit caches than fp32 ones",
          "[unit]") {
  // Prompts of 2000 tokens and answers of 256 (long enough to outlast the next prefills, so
  // that the pool, not the prefill queue, bounds how many run): an fp32 cache of 2256 tokens
  // is 8.8 MiB here (4 layers, 2 KV heads of 64: 4 KiB a token); the pool holds four.
  const auto most_running = [](const std::string& method, const std::string& packing) {
    ServerProcess server(serving_model_path(),
                         {"--kv-pool-mib", "36", "--max-seqs", "16", "--method", method,
                          "--prompt-packing", packing});
    std::vector<std::thread> clients;
    std::vector<Reply> replies(16);
    for (int i = 0; i < 16; ++i) {
      clients.emplace_back([&, i] {
        replies[i] = post(server.port, "/v1/completions",
                          json{{"prompt", random_tokens(2000, 4000, 100 + i)},
                               {"max_tokens", 256},
                               {"ignore_eos", true}}
                              .dump());
      });
    }
    for (auto& t : clients) t.join();
    for (const Reply& r : replies) {  // those that did not fit queued, then ran
      INFO(method << ": " << r.body.substr(0, 300));
      CHECK(r.status == 200);
    }
    // Every byte back in the pool (the metrics follow the engine's step that ended the last).
    CHECK(metric_reaches(server.port, "kv_pool_reserved_bytes", 0));
    return metric(server.port, "most_running_sequences");
  };
  const double full = most_running("full", "chunk");
  // Each prompt chunk packed as it comes in, the room of its 4-bit blocks reserved.
  const double kivi = most_running("kivi:bits=4", "chunk");
  // Held at fp32 until the prompt's end: one such prompt at a time beside the packed others.
  const double kivi_at_end = most_running("kivi:bits=4", "end");
  INFO("full " << full << ", kivi " << kivi << ", kivi packed at the prompt's end "
               << kivi_at_end);
  CHECK(full == 4);
  CHECK(kivi >= 3 * full);  // 14 here
  CHECK(kivi_at_end >= 2 * full);  // 9 here
  CHECK(kivi > kivi_at_end);
}

TEST_CASE("serve: prefix reuse shared by concurrent requests: each answered, later ones reuse",
          "[unit]") {
  // Eight requests at once whose prompts share a long prefix: prefills run one after the
  // other, each capturing its own blocks (two captures at once crashed the server before).
  ServerProcess server(serving_model_path(), {"--method", "prefix:block=16+tiers:device=8MB", "--max-seqs", "8"});
  const std::vector<int32_t> shared = random_tokens(200, 4000, 9);
  std::vector<Reply> replies(8);
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      std::vector<int32_t> prompt = shared;
      const std::vector<int32_t> own = random_tokens(20 + 5 * i, 4000, 50 + i);
      prompt.insert(prompt.end(), own.begin(), own.end());
      replies[i] = post(server.port, "/v1/completions",
                        json{{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0},
                             {"ignore_eos", true}, {"stream", i % 2 == 0}}
                            .dump());
    });
  }
  for (auto& t : clients) t.join();
  for (const Reply& r : replies) {
    INFO(r.body.substr(0, 300));
    CHECK(r.status == 200);
  }
  CHECK(metric(server.port, "prefix_hit_tokens_total") >= 7 * 192);  // 12 whole blocks each
  CHECK(metric(server.port, "requests_finished_total") == 8);
  // And the server is still there for the next.
  CHECK(post(server.port, "/v1/completions", json{{"prompt", shared}, {"max_tokens", 4}}.dump())
            .status == 200);
}
