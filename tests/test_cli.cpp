// The kvbench binary on bad input: one clear line naming the input, exit code 2, no crash.
// And the happy path on a tiny model written by the test.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "gguf_writer.h"

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
