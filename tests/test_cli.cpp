// The kvbench binary on bad input: one clear line naming the input, exit code 2, no crash.
// And the happy path on a tiny model written by the test.
#include <catch2/catch.hpp>

#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "cache/registry.h"
#include "cli_run.h"
#include "gguf_writer.h"
#include "store/results_db.h"

using namespace kvbench;

using testing::count_lines;
using testing::one_unit_db;
using testing::require_clear_error;
using testing::Run;
using testing::run_kvbench;
using testing::write_text;

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
  // Q2_K (10): a real ggml type kvbench does not decode.
  writer.add_tensor_bytes("blk.0.attn_q.weight", {256}, static_cast<GgmlType>(10),
                          std::vector<uint8_t>(84, 0));
  writer.write(path);
  const Run run = run_kvbench("--model " + path + " generate --prompt hi");
  require_clear_error(run, path);
  CHECK(run.output.find("type 10") != std::string::npos);
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

TEST_CASE("cli: --device cuda is refused for methods it cannot run and without a GPU", "[unit]") {
  require_clear_error(run_kvbench("--device cuda generate --prompt hi --method cacheblend"),
                      "method 'cacheblend' in 'cacheblend:");
  require_clear_error(run_kvbench("--device cuda generate --prompt hi --method prefix"),
                      "does not run on --device cuda yet");
  require_clear_error(run_kvbench("--device tpu generate --prompt hi"), "--device");
  // With a GPU it generates; without one (or in a build without CUDA) one clear line.
  const std::string path = testing::temp_path("tiny_cli_cuda.gguf");
  testing::write_tiny_llama_gguf(path);
  const Run run = run_kvbench("--model " + path + " --device cuda generate --prompt hi");
  INFO(run.output);
  CHECK((run.exit_code == 0 || run.exit_code == 2));
  if (run.exit_code == 2) require_clear_error(run, "--device cuda");
}

TEST_CASE("cli: --decode-activations takes fp32 or int8, int8 on the CPU only", "[unit]") {
  require_clear_error(run_kvbench("--device cuda --decode-activations int8 list models"),
                      "--decode-activations int8: runs only on the CPU");
  require_clear_error(run_kvbench("--decode-activations int4 list models"),
                      "--decode-activations");
}

TEST_CASE("cli: --dtype bf16 is refused without --device cuda, even where no model loads",
          "[unit]") {
  require_clear_error(run_kvbench("--dtype bf16 generate --prompt hi"),
                      "--dtype bf16: runs only with --device cuda");
  require_clear_error(run_kvbench("--dtype bf16 list models"), "--dtype bf16");
  require_clear_error(run_kvbench("--device cuda --dtype fp16 generate --prompt hi"), "--dtype");
  // fp32 is the default, and valid on the CPU when given.
  const std::string path = testing::temp_path("tiny_cli_dtype.gguf");
  testing::write_tiny_llama_gguf(path);
  const Run run = run_kvbench("--model " + path + " --dtype fp32 generate --prompt hi --max-new 2");
  INFO(run.output);
  CHECK(run.exit_code == 0);
}

TEST_CASE("cli: bad options exit 2 with one line", "[unit]") {
  require_clear_error(run_kvbench("generate --prompt hi --max-new -3"), "max-new");
  require_clear_error(run_kvbench("frobnicate"), "frobnicate");
  // An option no command takes stops the run before its command writes anything.
  const std::string config = write_text("bogus_option.json", "{\"tasks\": [\"retr_kv\"]}");
  const std::string db = testing::temp_path("bogus_option.db");
  std::remove(db.c_str());
  require_clear_error(run_kvbench("sweep " + config + " --bogus --db " + db), "--bogus");
  CHECK_FALSE(std::filesystem::exists(db));
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

TEST_CASE("cli: list models names every model kvbench fetches by short name", "[unit]") {
  const Run run = run_kvbench("list models");
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK(run.output.find("smollm2-135m") != std::string::npos);
  CHECK(run.output.find("qwen2.5-0.5b") != std::string::npos);
  // Fetched on its first use: listed with its size until then, with its config after.
  const size_t third = run.output.find("qwen2.5-1.5b");
  REQUIRE(third != std::string::npos);
  const std::string line = run.output.substr(third, run.output.find('\n', third) - third);
  const bool listed = line.find("fetched on first use, 1066 MiB") != std::string::npos ||
                      line.find("Qwen2.5 Coder 1.5B Instruct") != std::string::npos;
  CHECK(listed);
}

TEST_CASE("cli: calibrate names a bad task setting before loading anything", "[unit]") {
  const std::string run = "--model " + testing::temp_path("absent_cal.gguf") + " calibrate ";
  require_clear_error(run_kvbench(run + "--task nosuch"), "'nosuch' is not a generated task");
  require_clear_error(run_kvbench(run + "--task 'retr_kv[key_length]'"),
                      "knob 'key_length' must be name=value");
  require_clear_error(run_kvbench(run + "--task 'retr_kv[key_length=8'"),
                      "must be name or name[knob=value,...]");
}

TEST_CASE("cli: list methods and list tasks need no model", "[unit]") {
  const Run methods = run_kvbench("--model /nonexistent.gguf list methods");
  INFO(methods.output);
  CHECK(methods.exit_code == 0);
  for (const char* name : {"full", "streamingllm", "h2o", "snapkv", "pyramidkv", "tova", "knorm",
                           "keydiff", "budget", "arXiv"}) {
    CHECK(methods.output.find(name) != std::string::npos);
  }
  // Where kvbench chooses otherwise than the authors' code, the listing says so.
  for (const char* choice : {"choice: GQA: the group's query-head scores are averaged",
                             "choice: tail=kivi (default) is KIVI's rule"}) {
    CHECK(methods.output.find(choice) != std::string::npos);
  }
  const Run tasks = run_kvbench("--model /nonexistent.gguf list tasks");
  INFO(tasks.output);
  CHECK(tasks.exit_code == 0);
  for (const char* name : {"retr_kv", "retr_prefix_suffix", "multihop_vt", "math_find", "mix",
                           "niah", "repoqa"}) {
    CHECK(tasks.output.find(name) != std::string::npos);
  }
  // The natural tasks' corpora, with the packages they are pinned to.
  for (const char* corpus : {"gnu-standards", "Debian bookworm gnu-standards 2022.03.23-0.1",
                             "more-itertools", "PyPI more-itertools 10.5.0 sdist"}) {
    CHECK(tasks.output.find(corpus) != std::string::npos);
  }
}

namespace {

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
  const std::string session = "session --sample " + path + " --method ";
  require_clear_error(run_kvbench(session + "full --mode multi-turn --turn-gap 5"),
                      "it needs --mode multi-request");
  require_clear_error(run_kvbench(session + "full --mode multi-request --turn-gap -1"),
                      "--turn-gap -1: expected seconds >= 0");
  require_clear_error(
      run_kvbench(session + "prefix:block=64+snapkv --mode multi-request --query-aware"),
      "query setting aware");
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
  // A query-aware run and a gap between requests say so in the header.
  const Run aware = run_kvbench("--model " + model + " --threads 1 session --sample " + path +
                                " --method snapkv:budget=8,window=4 --mode multi-request --max-new 4 "
                                "--query-aware --turn-gap 30");
  INFO(aware.output);
  CHECK(aware.exit_code == 0);
  CHECK(aware.output.find("query aware, turn gap 30 s (simulated)") != std::string::npos);
  const Run none = run_kvbench("--model " + model + " --threads 1 session --sample " + path +
                               " --method full --mode multi-turn --no-fidelity --turns 1");
  INFO(none.output);
  CHECK(none.exit_code == 0);
  CHECK(none.output.find("summary s1: 1 turn |") != std::string::npos);
  CHECK(none.output.find("no fidelity") != std::string::npos);
}

TEST_CASE("cli: run names an unknown task, a bad knob or misplaced options before loading", "[unit]") {
  const std::string absent = testing::temp_path("absent_run.gguf");
  const std::string run = "--model " + absent + " run --method full ";
  require_clear_error(run_kvbench(run + "--task nosuch"), "unknown task 'nosuch'");
  require_clear_error(run_kvbench(run + "--task retr_kv --knob hops"), "--knob 'hops' must be name=value");
  require_clear_error(run_kvbench(run + "--task retr_kv --mode scdq"), "unknown session mode 'scdq'");
  require_clear_error(run_kvbench(run + "--task retr_kv --method 'snapkv:budget=-5'"), "snapkv:budget=-5");
  require_clear_error(run_kvbench(run + "--task scbench_kv"), "--data");
  require_clear_error(run_kvbench(run + "--task retr_kv --data x.jsonl"), "--data is for SCBench tasks");
  const std::string file = write_text("scbench_kv.jsonl", kSessionSample);
  require_clear_error(run_kvbench(run + "--task scbench_kv --data " + file + " --context-tokens 500"),
                      "--context-tokens");
  require_clear_error(run_kvbench(run + "--task scbench_kv --task retr_kv --data " + file),
                      "runs alone");
  const std::string bad = write_text("scbench_bad.jsonl", std::string(kSessionSample) + "\n{\"id\": 3}\n");
  require_clear_error(run_kvbench(run + "--task scbench_kv --data " + bad), bad + ":2: missing field");
}

TEST_CASE("cli: run refuses bad knob values and a context longer than the window", "[unit]") {
  testing::TinyLlamaSpec wide;
  wide.context_length = 4096;
  const std::string model = testing::temp_path("tiny_cli_run_wide.gguf");
  testing::write_tiny_llama_gguf(model, wide);
  const std::string run = "--model " + model + " --threads 1 run --method full ";
  require_clear_error(run_kvbench(run + "--task multihop_vt --context-tokens 800 --knob hops=0"),
                      "hops");
  require_clear_error(run_kvbench(run + "--task retr_kv --context-tokens 800 --knob colour=red"),
                      "unknown knob 'colour'");
  const std::string narrow = testing::temp_path("tiny_cli_run.gguf");
  testing::write_tiny_llama_gguf(narrow);  // context window 256 tokens
  const std::string run_narrow = "--model " + narrow + " --threads 1 run --method full ";
  require_clear_error(run_kvbench(run_narrow + "--task retr_kv --context-tokens 300"),
                      "context window of 256 tokens");
  // Fits the window alone, but not with five turns of queries and answers.
  require_clear_error(run_kvbench(run_narrow + "--task math_find --context-tokens 200 --turns 5"),
                      "more than the model's context of 256");
  // A decode budget past the window is refused before anything is reserved (a million
  // tokens' KV was reserved up front before).
  require_clear_error(run_kvbench(run_narrow + "--task retr_kv --context-tokens 160 --turns 1 "
                                               "--max-new 1048576"),
                      "max_new 1048576 is more tokens than the model's context of 256");
}

// duo_attention's probe at another length, as a gate file its pattern= reads.
TEST_CASE("cli: probe-heads writes a gate file that duo_attention reads back", "[unit]") {
  testing::TinyLlamaSpec spec;
  spec.context_length = 1024;
  const std::string model = testing::temp_path("tiny_cli_probe.gguf");
  testing::write_tiny_llama_gguf(model, spec);
  const std::string gates = testing::temp_path("probe_gates.tsv");
  std::filesystem::remove(gates);
  const Run probed = run_kvbench("--model " + model + " --threads 1 probe-heads --context-tokens 400 "
                                 "-o " + gates);
  INFO(probed.output);
  REQUIRE(probed.exit_code == 0);
  CHECK(probed.output.find("4 probes of about") != std::string::npos);
  // One line per layer, one tab-separated score per KV head.
  std::ifstream in(gates);
  std::string line;
  int layers = 0;
  while (std::getline(in, line)) {
    ++layers;
    CHECK(std::count(line.begin(), line.end(), '\t') == spec.n_head_kv - 1);
  }
  CHECK(layers == spec.n_layer);
  // The probes come within a few tokens of the length asked for.
  const size_t at = probed.output.find("of about ");
  REQUIRE(at != std::string::npos);
  const int tokens = std::stoi(probed.output.substr(at + 9));
  CHECK(tokens > 360);
  CHECK(tokens < 440);
  const std::string sample = write_text("probe_sample.jsonl", kSessionSample);
  const Run session = run_kvbench("--model " + model + " --threads 1 session --sample " + sample +
                                  " --method duo_attention:budget=32,sink=4,recent=8,pattern=" +
                                  gates + " --mode multi-turn --no-fidelity");
  INFO(session.output);
  CHECK(session.exit_code == 0);
  // Bad input: one line, exit 2, nothing written.
  const std::string missing = testing::temp_path("probe_not_written.tsv");
  std::filesystem::remove(missing);
  require_clear_error(run_kvbench("--model " + model + " probe-heads --context-tokens 4000 -o " +
                                  missing),
                      "do not fit the model's context");
  CHECK_FALSE(std::filesystem::exists(missing));
  require_clear_error(run_kvbench("--model " + model + " probe-heads -o " + model), "-o");
}

// Issue 55: another tool runs exactly kvbench's inputs and is scored by kvbench's scorers:
// `list tasks --export` writes a generated task's samples, `session` runs them scored (they
// name their task) and writes every turn with --out, and `score` scores any predictions.
TEST_CASE("cli: export a task, run it as a session, score the answers", "[unit]") {
  testing::TinyLlamaSpec wide;
  wide.context_length = 4096;
  const std::string model = testing::temp_path("tiny_cli_export.gguf");
  testing::write_tiny_llama_gguf(model, wide);
  const std::string samples = testing::temp_path("exported_retr_kv.jsonl");
  std::filesystem::remove(samples);
  const Run exported = run_kvbench("--model " + model + " list tasks --export retr_kv --samples 2"
                                   " --context-tokens 600 --turns 2 -o " + samples);
  INFO(exported.output);
  REQUIRE(exported.exit_code == 0);
  std::ifstream in(samples);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    CHECK(line.find("\"task\":\"retr_kv\"") != std::string::npos);
  }
  CHECK(lines == 2);
  // The same export to stdout.
  const Run printed = run_kvbench("--model " + model + " list tasks --export retr_kv --samples 2"
                                  " --context-tokens 600 --turns 2");
  CHECK(printed.exit_code == 0);
  CHECK(count_lines(printed.output) == 2);

  const std::string turns = testing::temp_path("exported_turns.jsonl");
  std::filesystem::remove(turns);
  const Run session = run_kvbench("--model " + model + " --threads 1 session --sample " + samples +
                                  " --method full --method streamingllm:budget=32 --mode "
                                  "multi-request --no-fidelity --out " + turns);
  INFO(session.output);
  REQUIRE(session.exit_code == 0);
  CHECK(session.output.find("score") != std::string::npos);
  {
    // Decoded to the task's length, as a sweep decodes it (retr_kv: 96 tokens; the tiny
    // model never ends a turn), not to a default of the session command's.
    std::ifstream written(turns);
    std::string row;
    int rows = 0;
    while (std::getline(written, row)) {
      ++rows;
      CHECK(row.find("\"output_tokens\":96") != std::string::npos);
    }
    CHECK(rows == 8);
  }
  const Run scored = run_kvbench("score --sample " + samples + " --predictions " + turns);
  INFO(scored.output);
  REQUIRE(scored.exit_code == 0);
  // 2 samples x 2 turns x 2 methods, each line with its score, then the means per method.
  CHECK(std::count(scored.output.begin(), scored.output.end(), '{') == 8);
  CHECK(scored.output.find("\"score\":") != std::string::npos);
  CHECK(scored.output.find("score: full") != std::string::npos);
  CHECK(scored.output.find("of 4 turns") != std::string::npos);

  // Bad input: one line, exit 2, nothing written.
  require_clear_error(run_kvbench("list tasks --samples 3"), "--samples needs --export");
  require_clear_error(run_kvbench("--model " + model + " list tasks --export scbench_kv"),
                      "scbench_kv");
  const std::string plain = write_text("plain_sample.jsonl", kSessionSample);
  require_clear_error(run_kvbench("score --sample " + plain + " --predictions " + turns),
                      "names no task");
  const std::string stranger = write_text("stranger.jsonl",
                                          R"({"sample": "nope", "turn": 1, "prediction": "x"})");
  require_clear_error(run_kvbench("score --sample " + samples + " --predictions " + stranger),
                      "no sample 'nope'");
  const std::string untyped = write_text("untyped.jsonl",
                                         R"({"sample": "retr_kv-seed0-0", "turn": "1", "prediction": "x"})");
  require_clear_error(run_kvbench("score --sample " + samples + " --predictions " + untyped),
                      "needs a field 'turn'");
  require_clear_error(run_kvbench("score --sample " + samples + " --predictions " + turns +
                                  " -o " + samples),
                      "also an input");
  const std::string unknown = write_text("unknown_task.jsonl",
      R"({"id": "u", "task": "no_such_task", "context": "c", "multi_turns": [{"input": "q", "answer": "a"}]})");
  require_clear_error(run_kvbench("--model " + model + " session --sample " + unknown +
                                  " --method full --mode multi-turn"),
                      "unknown task 'no_such_task'");
}

TEST_CASE("cli: run on a tiny model scores every turn and prints the summary", "[unit]") {
  testing::TinyLlamaSpec wide;
  wide.context_length = 4096;
  const std::string model = testing::temp_path("tiny_cli_run_wide.gguf");
  testing::write_tiny_llama_gguf(model, wide);
  const Run out = run_kvbench("--model " + model +
                              " --threads 1 run --task math_find --task retr_kv --context-tokens 600"
                              " --turns 2 --method full --method streamingllm:budget=32 --max-new 4");
  INFO(out.output);
  CHECK(out.exit_code == 0);
  CHECK(out.output.find("sample math_find-seed0-0") != std::string::npos);
  CHECK(out.output.find("sample retr_kv-seed0-0") != std::string::npos);
  CHECK(out.output.find("acc % by turn") != std::string::npos);
  // One summary row per (task, method); the full cache is its own reference.
  CHECK(out.output.find("math_find            multi-turn    full") != std::string::npos);
  CHECK(out.output.find("retr_kv              multi-turn    streamingllm:budget=32") !=
        std::string::npos);
  const Run quiet = run_kvbench("--model " + model +
                                " --threads 1 run --task retr_kv --context-tokens 600 --turns 1"
                                " --method full --summary-only --no-fidelity --max-new 2");
  INFO(quiet.output);
  CHECK(quiet.exit_code == 0);
  CHECK(quiet.output.find("[1/1] retr_kv-seed0-0 full: score") != std::string::npos);
  CHECK(quiet.output.find("TTFT ms") != std::string::npos);  // the summary table
}

namespace {

std::string write_sweep_config(const std::string& name) {
  return write_text(name, R"({"tasks": ["math_find"], "methods": ["full", "streamingllm"],
    "budgets": [32], "samples": 1, "turns": 2, "context_tokens": 300, "max_new": 3})");
}

}  // namespace

TEST_CASE("cli: sweep, report and check name a bad db, config or baseline in one line", "[unit]") {
  testing::TinyLlamaSpec wide;
  wide.context_length = 2048;
  const std::string model = testing::temp_path("tiny_cli_sweep.gguf");
  testing::write_tiny_llama_gguf(model, wide);
  const std::string config = write_sweep_config("sweep_ok.json");
  const std::string sweep = "--model " + model + " --threads 1 sweep " + config;
  require_clear_error(run_kvbench(sweep + " --db /nonexistent/dir/r.db"), "/nonexistent/dir/r.db");
  const std::string garbage = write_text("garbage.db", "this is not a database, just text\n");
  require_clear_error(run_kvbench(sweep + " --db " + garbage), garbage + ": not a kvbench results db");
  require_clear_error(run_kvbench(sweep + " --db x.db --shard 3/2"), "shard '3/2'");
  require_clear_error(run_kvbench("--model " + model + " sweep /nonexistent.json --db x.db"),
                      "/nonexistent.json");
  require_clear_error(run_kvbench("--model " + model + " sweep " + write_text("bad.json", "{\"tasks\": 1}") +
                                  " --db x.db"),
                      "tasks must be a list");
  require_clear_error(run_kvbench("report " + garbage + " -o " + testing::temp_path("rep")),
                      "not a kvbench results db");
  require_clear_error(run_kvbench("check " + garbage + " --baseline b.json"), "b.json");
  require_clear_error(run_kvbench("check " + garbage), "--baseline");
  require_clear_error(run_kvbench("run --task retr_kv"), "--method");
  require_clear_error(run_kvbench("run --out x --samples 3"), "takes only --out");
}

TEST_CASE("cli: a sweep into a db, its report, and the check against its own baseline", "[slow]") {
  testing::TinyLlamaSpec wide;
  wide.context_length = 2048;
  const std::string model = testing::temp_path("tiny_cli_sweep.gguf");
  testing::write_tiny_llama_gguf(model, wide);
  const std::string config = write_sweep_config("sweep_ok.json");
  const std::string db = testing::temp_path("cli_sweep.db");
  const Run first = run_kvbench("--model " + model + " --threads 1 sweep " + config + " --db " + db);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(first.output.find("sweep: 2 units written to " + db + " (shard 0/1; 0 already there)") !=
        std::string::npos);
  const Run again = run_kvbench("--model " + model + " --threads 1 sweep " + config + " --db " + db);
  CHECK(again.output.find("sweep: 0 units written to " + db +
                          " (shard 0/1; 2 already there; nothing to run, the model not loaded)") !=
        std::string::npos);
  // A run of one task stored in a db: the same tables, and resumable.
  const std::string run_db = testing::temp_path("cli_run.db");
  const std::string run = "--model " + model + " --threads 1 run --task math_find --context-tokens 300"
                          " --turns 2 --max-new 3 --method full --method streamingllm:budget=32 --db " +
                          run_db;
  const Run stored = run_kvbench(run);
  INFO(stored.output);
  CHECK(stored.exit_code == 0);
  CHECK(stored.output.find("sweep: 2 units written to " + run_db) != std::string::npos);
  CHECK(stored.output.find("acc % by turn") != std::string::npos);
  CHECK(stored.output.find("sample math_find-seed0-0") != std::string::npos);
  CHECK(run_kvbench(run).output.find("sweep: 0 units written") != std::string::npos);
  require_clear_error(run_kvbench(run + " --append model"), "--append model");
  const std::string out = testing::temp_path("cli_reports");
  const Run report = run_kvbench("report " + db + " -o " + out);
  INFO(report.output);
  CHECK(report.exit_code == 0);
  CHECK(report.output.find(out + "/leaderboard.md") != std::string::npos);
  const std::string baseline = testing::temp_path("cli_baseline.json");
  CHECK(run_kvbench("check " + db + " --write-baseline " + baseline).exit_code == 0);
  const Run same = run_kvbench("check " + db + " --baseline " + baseline);
  INFO(same.output);
  CHECK(same.exit_code == 0);
  CHECK(same.output.find("no regressions in 2 baseline rows") != std::string::npos);
  // A baseline that asks for more: exit 1 with the table.
  const std::string strict = write_text(
      "strict.json", R"({"kvbench_baseline": 1, "rows": [{"method": "streamingllm:budget=32,sink=4,prefill=dense",
      "task": "math_find", "mode": "multi-turn", "budget": "budget=32", "accuracy": 1.0,
      "accuracy_low": 1.0, "accuracy_high": 1.0, "scored_turns": 2,
      "top1_agreement": 1.0, "kv_bytes": 1, "decode_tokens_per_s": 0, "ttft_ms": 0},
      {"method": "h2o", "task": "math_find", "mode": "multi-turn", "budget": "",
      "accuracy": null, "top1_agreement": null, "kv_bytes": 1, "decode_tokens_per_s": 0, "ttft_ms": 0}]})");
  const Run worse = run_kvbench("check " + db + " --baseline " + strict);
  INFO(worse.output);
  CHECK(worse.exit_code == 1);
  CHECK(worse.output.find("regressions in 2 baseline rows") != std::string::npos);
  CHECK(worse.output.find("missing") != std::string::npos);
  CHECK(worse.output.find("KV bytes") != std::string::npos);
}

TEST_CASE("cli: sweep --jobs runs worker processes into one db, as one process would", "[slow]") {
  testing::TinyLlamaSpec wide;
  wide.context_length = 2048;
  const std::string model = testing::temp_path("tiny_cli_jobs.gguf");
  testing::write_tiny_llama_gguf(model, wide);
  const std::string config = write_text("sweep_jobs.json", R"({"tasks": ["math_find", "retr_kv"],
    "methods": ["full", "snapkv", "streamingllm"], "budgets": [32], "samples": 2, "turns": 2,
    "context_tokens": 300, "max_new": 3})");
  const std::string one = testing::temp_path("jobs_one.db"), two = testing::temp_path("jobs_two.db");
  const Run single = run_kvbench("--model " + model + " --threads 1 sweep " + config + " --db " + one);
  INFO(single.output);
  REQUIRE(single.exit_code == 0);
  const Run jobs =
      run_kvbench("--model " + model + " --threads 1 sweep " + config + " --db " + two + " --jobs 2");
  INFO(jobs.output);
  REQUIRE(jobs.exit_code == 0);
  CHECK(jobs.output.find("sweep: 2 workers done into " + two) != std::string::npos);
  // Each worker counts the units it wrote, not the db's (they were 5 and 6 of 12 before).
  int written = 0, workers = 0;
  for (size_t at = jobs.output.find(" written to "); at != std::string::npos;
       at = jobs.output.find(" written to ", at + 1)) {
    const size_t line = jobs.output.rfind("sweep: ", at);
    written += std::atoi(jobs.output.c_str() + line + 7);  // "sweep: N units written to"
    ++workers;
  }
  CHECK(workers == 2);
  CHECK(written == 12);
  // The same units, each with the same predictions, scores and bytes.
  const auto units_of = [](const std::string& path) {
    std::map<std::string, UnitRecord> by_key;
    for (UnitRecord& u : ResultsDb::open(path, true)->units()) by_key[u.key] = std::move(u);
    return by_key;
  };
  const auto a = units_of(one), b = units_of(two);
  REQUIRE(a.size() == 12);  // 2 tasks x 2 samples x 3 methods
  REQUIRE(b.size() == a.size());
  for (const auto& [key, u] : a) {
    INFO(key);
    REQUIRE(b.count(key) == 1);
    const UnitRecord& v = b.at(key);
    REQUIRE(u.turns.size() == v.turns.size());
    CHECK(u.shared_prefill == v.shared_prefill);
    for (size_t t = 0; t < u.turns.size(); ++t) {
      CHECK(u.turns[t].prediction == v.turns[t].prediction);
      CHECK(u.turns[t].score == v.turns[t].score);
      CHECK(u.turns[t].kv_bytes == v.turns[t].kv_bytes);
      CHECK(u.turns[t].first_token_kl == v.turns[t].first_token_kl);
    }
  }
  // Resumed with workers: nothing left to run, and neither worker loads the model for it.
  const Run again =
      run_kvbench("--model " + model + " --threads 1 sweep " + config + " --db " + two + " --jobs 2");
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK(units_of(two).size() == 12);
  int idle = 0;
  for (size_t at = again.output.find("nothing to run, the model not loaded");
       at != std::string::npos; at = again.output.find("nothing to run, the model not loaded", at + 1)) {
    ++idle;
  }
  CHECK(idle == 2);
  require_clear_error(run_kvbench("--model " + model + " sweep " + config + " --db " + two +
                                  " --jobs 2 --shard 0/2"),
                      "--jobs or --shard");
}

// ---------------------------------------------------------------------------------------
// Issue 20: the inputs a code read found, each one line and exit 2 (exit 3, a crash or two
// lines before).

TEST_CASE("cli: hostile input is one line and exit 2", "[unit]") {
  const std::string db = one_unit_db("hostile_ok.db", "full");

  SECTION("a sweep config nested 200,000 levels deep") {
    const std::string deep = "{\"tasks\": [\"retr_kv\"], \"methods\": [\"full\"], \"budgets\": [" +
                             std::string(200000, '[') + std::string(200000, ']') + "]}";
    require_clear_error(run_kvbench("sweep " + write_text("deep.json", deep) + " --db x.db"),
                        "nested deeper than 64 levels");
  }
  SECTION("--model and KVBENCH_MODEL paths that make std::filesystem throw") {
    const std::string long_name = "/tmp/" + std::string(300, 'a') + "/m.gguf";
    require_clear_error(run_kvbench("--model " + long_name + " generate --prompt hi"),
                        "model not found");
    const std::string loop = testing::temp_path("loop");
    std::remove(loop.c_str());
    REQUIRE(symlink(loop.c_str(), loop.c_str()) == 0);  // a link to itself
    require_clear_error(run_kvbench("--model " + loop + "/m.gguf generate --prompt hi"),
                        "model not found");
    setenv("KVBENCH_MODEL", long_name.c_str(), 1);
    const Run run = run_kvbench("generate --prompt hi");
    unsetenv("KVBENCH_MODEL");
    require_clear_error(run, "model not found");
  }
  SECTION("a baseline whose version is a string or null") {
    for (const std::string version : {"\"1\"", "null", "[1]"}) {
      const std::string baseline =
          write_text("typed_baseline.json", "{\"kvbench_baseline\": " + version + ", \"rows\": []}");
      require_clear_error(run_kvbench("check " + db + " --baseline " + baseline),
                          "not a kvbench baseline");
    }
  }
  SECTION("numbers past double's range in a config and a baseline") {
    require_clear_error(run_kvbench("sweep " + write_text("big.json", "{\"samples\": 1e400}") +
                                    " --db x.db"),
                        "malformed JSON");
    require_clear_error(run_kvbench("check " + db + " --baseline " +
                                    write_text("big_baseline.json", "[1e400]")),
                        "malformed JSON");
  }
  SECTION("an error message that echoes a newline stays one line") {
    require_clear_error(run_kvbench("session --sample /nonexistent.jsonl --mode multi-turn --method 'snap\nkv'"),
                        "snap\\nkv");
  }
  SECTION("a truncated db, and one with kvbench's tables but other columns") {
    std::vector<uint8_t> bytes = testing::read_file_bytes(db);
    bytes.resize(bytes.size() / 2);
    const std::string truncated = testing::temp_path("truncated.db");
    testing::write_file(truncated, bytes);
    const std::string other = testing::temp_path("other_columns.db");
    std::remove(other.c_str());
    sqlite3* handle = nullptr;
    REQUIRE(sqlite3_open(other.c_str(), &handle) == SQLITE_OK);
    // The current version, so that the columns are what fails.
    const std::string schema = "PRAGMA user_version = " + std::to_string(kResultsSchemaVersion) +
                               "; CREATE TABLE runs(x); CREATE TABLE units(y); "
                               "CREATE TABLE results(z);";
    REQUIRE(sqlite3_exec(handle, schema.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(handle);
    for (const std::string& bad : {truncated, other}) {
      require_clear_error(run_kvbench("report " + bad + " -o " + testing::temp_path("rep_bad")), bad);
      require_clear_error(run_kvbench("check " + bad + " --write-baseline " +
                                      testing::temp_path("b_bad.json")),
                          bad);
      const std::string merged = testing::temp_path("merged_bad.db");
      std::remove(merged.c_str());
      require_clear_error(run_kvbench("merge " + bad + " -o " + merged), bad);
    }
  }
}

TEST_CASE("cli: strings that are not UTF-8 are stored and shown, not an internal error", "[unit]") {
  // A method name in a db (a shard written elsewhere) that is not UTF-8: the report and the
  // baseline written from it replace the bad byte.
  const std::string db = one_unit_db("not_utf8.db", "snapkv:budget=1\xff");
  const Run report = run_kvbench("report " + db + " -o " + testing::temp_path("rep_utf8"));
  INFO(report.output);
  CHECK(report.exit_code == 0);
  const Run baseline =
      run_kvbench("check " + db + " --write-baseline " + testing::temp_path("b_utf8.json"));
  INFO(baseline.output);
  CHECK(baseline.exit_code == 0);
  // run --db records its config (a tiers:disk= path that is not UTF-8) as JSON.
  testing::TinyLlamaSpec wide;
  wide.context_length = 2048;
  const std::string model = testing::temp_path("tiny_cli_utf8.gguf");
  testing::write_tiny_llama_gguf(model, wide);
  const std::string out_db = testing::temp_path("run_utf8.db");
  std::remove(out_db.c_str());
  const Run run = run_kvbench("--model " + model + " --threads 1 run --task retr_kv --context-tokens 300"
                              " --turns 1 --max-new 2 --no-fidelity --method 'prefix+tiers:disk=" +
                              testing::temp_path("disk\xff") + "' --db " + out_db);
  INFO(run.output);
  CHECK(run.exit_code == 0);
}
