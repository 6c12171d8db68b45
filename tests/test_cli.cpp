// The kvbench binary on bad input: one clear line naming the input, exit code 2, no crash.
// And the happy path on a tiny model written by the test.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "gguf_writer.h"
#include "methods/registry.h"

using namespace kvbench;

namespace {

struct Run {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

Run run_kvbench(const std::string& args) {
  const std::string command = std::string(KVBENCH_BINARY) + " " + args + " 2>&1";
  Run run;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

int count_lines(const std::string& text) {
  int lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

// One line, exit 2, mentioning `needle`.
void require_clear_error(const Run& run, const std::string& needle) {
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(count_lines(run.output) == 1);
  CHECK(run.output.rfind("kvbench: error: ", 0) == 0);
  CHECK(run.output.find(needle) != std::string::npos);
}

}  // namespace

TEST_CASE("cli: a missing model says how to get it", "[unit]") {
  const std::string path = testing::temp_path("absent.gguf");
  const Run run = run_kvbench("--model " + path + " generate --prompt hi");
  require_clear_error(run, path);
  CHECK(run.output.find("scripts/setup.sh") != std::string::npos);
}

TEST_CASE("cli: corrupt and truncated GGUF files are named", "[unit]") {
  const std::string path = testing::temp_path("corrupt.gguf");
  SECTION("not a GGUF at all") { testing::write_file(path, {'n', 'o', 'p', 'e', 0, 1, 2, 3}); }
  SECTION("truncated") {
    auto bytes = testing::small_gguf_bytes();
    bytes.resize(bytes.size() - 7);
    testing::write_file(path, bytes);
  }
  require_clear_error(run_kvbench("--model " + path + " generate --prompt hi"), path);
}

TEST_CASE("cli: an unknown tensor type is named", "[unit]") {
  const std::string path = testing::temp_path("unknown_type.gguf");
  testing::GgufWriter writer;
  writer.add("general.architecture", testing::gguf_str("llama"));
  writer.add_tensor_bytes("blk.0.attn_q.weight", {32}, static_cast<GgmlType>(6),
                          std::vector<uint8_t>(256, 0));
  writer.write(path);
  const Run run = run_kvbench("--model " + path + " generate --prompt hi");
  require_clear_error(run, path);
  CHECK(run.output.find("type 6") != std::string::npos);
}

TEST_CASE("cli: an unsupported architecture is named", "[unit]") {
  const std::string path = testing::temp_path("mamba.gguf");
  testing::GgufWriter writer;
  writer.add("general.architecture", testing::gguf_str("mamba"));
  writer.write(path);
  const Run run = run_kvbench("--model " + path + " generate --prompt hi");
  require_clear_error(run, "mamba");
  CHECK(run.output.find(path) != std::string::npos);
}

TEST_CASE("cli: a prompt longer than the context is refused", "[unit]") {
  const std::string path = testing::temp_path("tiny_cli_ctx.gguf");
  testing::TinyLlamaSpec spec;
  spec.context_length = 64;
  testing::write_tiny_llama_gguf(path, spec);
  const Run run = run_kvbench("--model " + path + " generate --raw --prompt '" +
                              std::string(300, 'x') + "'");
  require_clear_error(run, "context of 64 tokens");
}

TEST_CASE("cli: bad options exit 2 with one line", "[unit]") {
  require_clear_error(run_kvbench("generate --prompt hi --max-new -3"), "max-new");
  require_clear_error(run_kvbench("frobnicate"), "frobnicate");
}

TEST_CASE("cli: generate on a tiny model prints the reply and the figures", "[unit]") {
  const std::string path = testing::temp_path("tiny_cli.gguf");
  testing::write_tiny_llama_gguf(path);
  const Run run =
      run_kvbench("--model " + path + " generate --threads 1 --prompt 'say something' --max-new 8");
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("prefill:") != std::string::npos);
  CHECK(run.output.find("tok/s") != std::string::npos);
  CHECK(run.output.find("TTFT") != std::string::npos);
  CHECK(run.output.find("bytes resident") != std::string::npos);
}

TEST_CASE("cli: list models shows a given model", "[unit]") {
  const std::string path = testing::temp_path("tiny_list.gguf");
  testing::write_tiny_llama_gguf(path);
  const Run run = run_kvbench("--model " + path + " list models");
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.find(path) != std::string::npos);
  CHECK(run.output.find("llama") != std::string::npos);
}

TEST_CASE("cli: list methods and list tasks need no model", "[unit]") {
  const Run methods = run_kvbench("--model /nonexistent.gguf list methods");
  INFO(methods.output);
  CHECK(methods.exit_code == 0);
  for (const char* name : {"full", "streamingllm", "h2o", "snapkv", "pyramidkv", "tova", "knorm",
                           "keydiff", "budget", "arXiv"}) {
    CHECK(methods.output.find(name) != std::string::npos);
  }
  const Run tasks = run_kvbench("--model /nonexistent.gguf list tasks");
  INFO(tasks.output);
  CHECK(tasks.exit_code == 0);
  for (const char* name : {"retr_kv", "retr_prefix_suffix", "multihop_vt", "math_find", "mix"}) {
    CHECK(tasks.output.find(name) != std::string::npos);
  }
}

namespace {

std::string write_text(const std::string& name, const std::string& text) {
  const std::string path = testing::temp_path(name);
  testing::write_file(path, std::vector<uint8_t>(text.begin(), text.end()));
  return path;
}

const char* kSessionSample =
    R"({"id": "s1", "context": "abc = 12, def = 34.", "multi_turns": [{"input": "abc?", "answer": "12"}, {"input": "def?", "answer": ["34", "thirty-four"]}]})";

}  // namespace

TEST_CASE("cli: session names a bad method spec before loading anything", "[unit]") {
  // The model and the sample file do not exist: the spec is checked first.
  const std::string absent = testing::temp_path("absent_session.gguf");
  std::vector<std::string> specs = {"nosuch", "full:budget=1", ":x"};
  if (find_method("snapkv")) specs.push_back("snapkv:ratio=2");
  for (const std::string& spec : specs) {
    const Run run = run_kvbench("--model " + absent + " session --sample /nonexistent.jsonl --method '" +
                                spec + "' --mode multi-turn");
    require_clear_error(run, "'" + spec + "'");
  }
}

TEST_CASE("cli: session names a malformed sample file by file:line", "[unit]") {
  const std::string absent = testing::temp_path("absent_session.gguf");
  const std::string path =
      write_text("malformed.jsonl", std::string(kSessionSample) + "\n\n{\"id\": 2, \"context\": \n");
  const Run run =
      run_kvbench("--model " + absent + " session --sample " + path + " --method full --mode multi-turn");
  require_clear_error(run, path + ":3: malformed JSON");
  const std::string missing_turns = write_text("no_turns.jsonl", R"({"id": 1, "context": "c"})");
  require_clear_error(run_kvbench("--model " + absent + " session --sample " + missing_turns +
                                  " --method full --mode multi-turn"),
                      missing_turns + ":1: missing field 'multi_turns'");
}

TEST_CASE("cli: session refuses an unknown mode, append source or sample id", "[unit]") {
  const std::string path = write_text("session_ok.jsonl", kSessionSample);
  require_clear_error(run_kvbench("session --sample " + path + " --method full --mode scdq"),
                      "unknown session mode 'scdq'");
  require_clear_error(
      run_kvbench("session --sample " + path + " --method full --mode multi-turn --append mine"),
      "unknown answer source 'mine'");
  require_clear_error(run_kvbench("session --sample " + path +
                                  " --method full --mode multi-turn --sample-id nope"),
                      "no sample with id 'nope'");
  require_clear_error(run_kvbench("session --sample " + path + " --method full"), "--mode");
}

TEST_CASE("cli: session on a tiny model prints the table and a summary", "[unit]") {
  const std::string model = testing::temp_path("tiny_cli_session.gguf");
  testing::write_tiny_llama_gguf(model);
  const std::string path = write_text("session_tiny.jsonl", kSessionSample);
  for (const std::string mode : {"multi-turn", "multi-request"}) {
    const Run run = run_kvbench("--model " + model + " --threads 1 session --sample " + path +
                                " --method full --mode " + mode + " --max-new 4");
    INFO(run.output);
    CHECK(run.exit_code == 0);
    CHECK(run.output.find("method: full") != std::string::npos);
    CHECK(run.output.find("TTFT ms") != std::string::npos);
    CHECK(run.output.find("summary s1: 2 turns") != std::string::npos);
    CHECK(run.output.find("mean KL 0.0000 | mean top-1 1.000") != std::string::npos);
  }
  const Run none = run_kvbench("--model " + model + " --threads 1 session --sample " + path +
                               " --method full --mode multi-turn --no-fidelity --turns 1");
  INFO(none.output);
  CHECK(none.exit_code == 0);
  CHECK(none.output.find("summary s1: 1 turn |") != std::string::npos);
  CHECK(none.output.find("no fidelity") != std::string::npos);
}
