// Sweeps: the config's validation, the units it expands to, shards, resume, and a sweep
// killed with SIGKILL twenty times that still ends with exactly an uninterrupted run's rows.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "gguf_writer.h"
#include "common/input_error.h"
#include "common/sha256.h"
#include "harness/sweep_config.h"
#include "harness/model/llama_model.h"
#include "harness/sweep.h"
#include "store/results_db.h"

using namespace kvbench;
using Catch::Contains;

namespace {

std::string tiny_model_path() {
  static const std::string path = [] {
    testing::TinyLlamaSpec spec;
    spec.context_length = 2048;
    const std::string p = testing::temp_path("tiny_sweep.gguf");
    testing::write_tiny_llama_gguf(p, spec);
    return p;
  }();
  return path;
}

const LlamaModel& tiny_model() {
  static const std::unique_ptr<LlamaModel> model = LlamaModel::load(tiny_model_path());
  return *model;
}

const char* kSmall = R"({"tasks": ["math_find", {"task": "retr_kv", "knobs": {"key_length": 8}}],
  "methods": ["full", "streamingllm", "snapkv"], "budgets": [32, "ratio=0.5"],
  "seeds": [0, 1], "samples": 1, "turns": 2, "context_tokens": 300, "max_new": 3})";

void require_config_error(const std::string& text, const std::string& what) {
  INFO(text);
  try {
    parse_sweep_config(text, "cfg.json");
    FAIL("no error");
  } catch (const InputError& e) {
    const std::string message = e.what();
    INFO(message);
    CHECK(message.rfind("cfg.json: ", 0) == 0);
    CHECK(message.find(what) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
  }
}

// What a run must reproduce exactly: everything but the timings.
using RowKey = std::tuple<std::string, int32_t>;
struct RowValue {
  std::string prediction, reference;
  std::optional<double> score, kl, top1;
  int64_t kv_bytes, prompt_tokens;
  bool operator==(const RowValue& o) const {
    return prediction == o.prediction && reference == o.reference && score == o.score &&
           kl == o.kl && top1 == o.top1 && kv_bytes == o.kv_bytes && prompt_tokens == o.prompt_tokens;
  }
};

std::map<RowKey, RowValue> table_of(const std::string& db_path, size_t* rows = nullptr) {
  auto db = ResultsDb::open(db_path, true);
  std::map<RowKey, RowValue> out;
  size_t n = 0;
  for (const UnitRecord& u : db->units()) {
    for (const TurnRow& t : u.turns) {
      ++n;
      const bool fresh = out.emplace(RowKey{u.key, t.turn},
                                     RowValue{t.prediction, t.reference, t.score, t.first_token_kl,
                                              t.top1_agreement, t.kv_bytes, t.prompt_tokens})
                             .second;
      CHECK(fresh);  // no row twice
    }
  }
  if (rows) *rows = n;
  return out;
}

RunRecord test_run() {
  RunRecord r;
  r.kvbench_version = "test";
  r.git_sha = "test";
  r.model_path = tiny_model_path();
  r.model_sha256 = "0";
  r.host = "test";
  r.command_line = "test_sweep";
  return r;
}

}  // namespace

TEST_CASE("sweep config: methods x budgets, full once, canonical JSON", "[unit]") {
  const SweepConfig c = parse_sweep_config(kSmall, "cfg.json");
  CHECK(c.tasks.size() == 2);
  CHECK(c.tasks[1].label() == "retr_kv[key_length=8]");
  const auto methods = sweep_methods(c);
  REQUIRE(methods.size() == 5);  // full + 2 methods x 2 budgets
  CHECK(methods[0].spec.canonical == "full");
  CHECK(methods[0].budget.empty());
  CHECK(methods[1].spec.canonical == "streamingllm:budget=32,sink=4,prefill=dense");
  CHECK(methods[1].budget == "budget=32");
  CHECK(methods[2].budget == "ratio=0.5");
  CHECK(canonical_config_json(c) == canonical_config_json(parse_sweep_config(kSmall, "other.json")));
  CHECK(canonical_config_json(c).find("\"snapkv:") != std::string::npos);
  // A composition takes the budget in its first component that takes one (adakv+snapkv's
  // snapkv); one without a budget once.
  SweepConfig composed = c;
  composed.methods = {"snapkv+kivi:bits=2", "kivi:bits=4", "adakv:floor=0.5+snapkv"};
  const auto with_kivi = sweep_methods(composed);
  REQUIRE(with_kivi.size() == 5);
  CHECK(with_kivi[3].spec.canonical ==
        "adakv:floor=0.5+snapkv:budget=32,window=32,kernel=5,pool=avg");
  CHECK(with_kivi[3].budget == "budget=32");
  CHECK(with_kivi[4].budget == "ratio=0.5");
  CHECK(with_kivi[0].spec.canonical ==
        "snapkv:budget=32,window=32,kernel=5,pool=avg+kivi:bits=2,residual=128,tail=kivi");
  CHECK(with_kivi[0].budget == "budget=32");
  CHECK(with_kivi[2].spec.canonical == "kivi:bits=4,residual=128,tail=kivi");
  CHECK(with_kivi[2].budget.empty());
  // The default sweep (configs/default.json): a model that can do its tasks, calibrated,
  // budgets as fractions of the context, enough turns for a full-cache interval of +-15.
  const SweepConfig d = default_sweep_config();
  CHECK(d.model == "qwen2.5-0.5b");
  CHECK(d.min_full_accuracy >= 0.8);
  CHECK(d.samples * d.turns >= 25);
  REQUIRE_FALSE(d.budgets.empty());
  for (const std::string& b : d.budgets) CHECK(b.rfind("ratio=", 0) == 0);
  CHECK(sweep_methods(d).size() >= 3);
  // A task over real prose beside the synthetic strings, so the default findings transfer.
  CHECK(std::any_of(d.tasks.begin(), d.tasks.end(), [](const SweepTask& t) { return t.name == "niah"; }));
  for (const std::string& method : d.methods) {
    CHECK(method != "prefix");  // multi-turn: reuse across requests has nothing to do
    CHECK(method != "tiers");
  }
}

TEST_CASE("sweep config: every mistake is one line naming the file and the key", "[unit]") {
  require_config_error("{", "malformed JSON");
  require_config_error("[]", "must be a JSON object");
  require_config_error(R"({"methods": ["full"]})", "missing 'tasks'");
  require_config_error(R"({"tasks": ["retr_kv"]})", "missing 'methods'");
  require_config_error(R"({"tasks": [], "methods": ["full"]})", "tasks is an empty list");
  require_config_error(R"({"tasks": ["nosuch"], "methods": ["full"]})", "unknown task 'nosuch'");
  require_config_error(R"({"tasks": ["retr_kv"], "methods": ["nosuch"]})", "nosuch");
  require_config_error(R"({"tasks": ["retr_kv"], "methods": ["full"], "colour": 1})", "unknown key 'colour'");
  require_config_error(R"({"tasks": ["retr_kv"], "methods": ["full"], "budgets": [-3]})", "-3");
  require_config_error(R"({"tasks": ["retr_kv"], "methods": ["snapkv"], "budgets": ["lots"]})", "budgets");
  require_config_error(R"({"tasks": ["retr_kv"], "methods": ["snapkv:budget=64"], "budgets": [80]})",
                       "sets its own budget");
  require_config_error(R"({"tasks": ["retr_kv"], "methods": ["full"], "modes": ["scdq"]})", "scdq");
  require_config_error(R"({"tasks": ["retr_kv"], "methods": ["full"], "turns": 0})", "turns must be in");
  require_config_error(R"({"tasks": ["scbench_kv"], "methods": ["full"]})", "needs \"data\"");
  require_config_error(R"({"tasks": ["retr_kv", "retr_kv"], "methods": ["full"]})", "listed twice");
  // Repeats refused before any unit is computed (they failed after the work before).
  require_config_error(R"({"tasks": ["retr_kv"], "methods": ["full"], "seeds": [0, 0]})",
                       "seeds: 0 is listed twice");
  require_config_error(R"({"tasks": ["retr_kv"], "methods": ["full", "full"]})", "methods");
  require_config_error(
      R"({"tasks": ["retr_kv"], "methods": ["full"], "modes": ["multi-turn", "multi-turn"]})",
      "modes");
  require_config_error(R"({"tasks": ["retr_kv"], "methods": ["full"], "modes": ["multi-request"],
                           "turn_gaps_s": [1, 1.0]})",
                       "turn_gaps_s");
  require_config_error(R"({"tasks": ["retr_kv"], "methods": ["snapkv"], "budgets": [64, 64]})",
                       "budgets");
  require_config_error(R"({"tasks": [{"task": "retr_kv", "knobs": {"k": [1]}}], "methods": ["full"]})",
                       "knobs.k");
}

TEST_CASE("sweep shards: i/n, SLURM and Kubernetes environments", "[unit]") {
  CHECK(parse_shard("2/4").index == 2);
  CHECK(parse_shard("2/4").count == 4);
  for (const char* bad : {"4/4", "-1/2", "1", "a/b", "1/0", "1/2x"}) {
    CHECK_THROWS_WITH(parse_shard(bad), Contains("must be i/n"));
  }
  for (const char* v : {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN",
                        "JOB_COMPLETION_INDEX", "KVBENCH_SHARD_COUNT"}) {
    unsetenv(v);
  }
  CHECK(shard_from_environment().count == 1);
  setenv("SLURM_ARRAY_TASK_ID", "3", 1);
  setenv("SLURM_ARRAY_TASK_COUNT", "4", 1);
  setenv("SLURM_ARRAY_TASK_MIN", "1", 1);
  CHECK(shard_from_environment().index == 2);
  CHECK(shard_from_environment().count == 4);
  unsetenv("SLURM_ARRAY_TASK_COUNT");
  CHECK_THROWS_WITH(shard_from_environment(), Contains("SLURM_ARRAY_TASK_COUNT"));
  unsetenv("SLURM_ARRAY_TASK_ID");
  unsetenv("SLURM_ARRAY_TASK_MIN");
  setenv("JOB_COMPLETION_INDEX", "1", 1);
  CHECK_THROWS_WITH(shard_from_environment(), Contains("KVBENCH_SHARD_COUNT"));
  setenv("KVBENCH_SHARD_COUNT", "3", 1);
  CHECK(shard_from_environment().index == 1);
  CHECK(shard_from_environment().count == 3);
  unsetenv("JOB_COMPLETION_INDEX");
  unsetenv("KVBENCH_SHARD_COUNT");
  // Issue 20: ID - MIN overflowed int (undefined; UBSan in CI); now an index past the count.
  setenv("SLURM_ARRAY_TASK_ID", "2147483647", 1);
  setenv("SLURM_ARRAY_TASK_MIN", "-2147483648", 1);
  setenv("SLURM_ARRAY_TASK_COUNT", "4", 1);
  CHECK_THROWS_WITH(shard_from_environment(), Contains("must be i/n"));
  for (const char* v : {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_COUNT"}) {
    unsetenv(v);
  }
}

TEST_CASE("sweep: every unit once, resumed runs skip, shards partition the units", "[unit]") {
  const SweepConfig c = parse_sweep_config(kSmall, "cfg.json");
  const size_t units = 2 /*tasks*/ * 2 /*seeds*/ * 5 /*methods*/;
  const std::string whole = testing::temp_path("sweep_whole.db");
  {
    auto db = ResultsDb::open(whole);
    int64_t calls = 0;
    run_sweep(tiny_model(), c, Shard{}, *db, test_run(), [&](const SweepProgress& p) {
      CHECK(p.total == static_cast<int64_t>(units));
      CHECK(p.done == calls);  // the first call is the plan, before any unit
      ++calls;
      // The plan: every unit of this invocation, per task.
      REQUIRE(p.planned.size() == 2);
      CHECK(p.planned[0].units + p.planned[1].units == static_cast<int64_t>(units));
      CHECK(p.planned[0].turns == c.turns);
      CHECK(p.planned[0].context_tokens == c.context_tokens);
      CHECK(p.planned[0].groups == 2);  // two seeds of one sample each
      CHECK(p.planned[0].units == 2 * 5);
    });
    CHECK(calls == static_cast<int64_t>(units) + 1);
    CHECK(db->finished_unit_keys().size() == units);
    const auto runs = db->runs();
    REQUIRE(runs.size() == 1);
    CHECK(runs[0].config_json == canonical_config_json(c));
    CHECK_FALSE(runs[0].finished_at.empty());
    // A rerun finds nothing to do.
    int64_t again = 0;
    run_sweep(tiny_model(), c, Shard{}, *db, test_run(), [&](const SweepProgress& p) {
      ++again;  // only the plan: nothing to run, every unit already there
      CHECK(p.total == 0);
      CHECK(p.skipped == static_cast<int64_t>(units));
    });
    CHECK(again == 1);
    CHECK(db->finished_unit_keys().size() == units);
  }
  size_t whole_rows = 0;
  const auto expected = table_of(whole, &whole_rows);
  CHECK(whole_rows == units * 2);
  // Every unit recorded its cache as the first turn left it, per layer and KV head (the
  // report's heat map): the full cache keeps every token seen, the others at most that.
  {
    const KvShape shape = tiny_model().kv_shape();
    size_t full_units = 0;
    for (const UnitRecord& u : ResultsDb::open(whole, true)->units()) {
      INFO(u.key);
      REQUIRE(u.head_tokens.size() == static_cast<size_t>(shape.n_layers));
      CHECK(u.head_tokens[0].size() == static_cast<size_t>(shape.n_kv_heads));
      CHECK(u.head_tokens_seen > 0);
      const bool full = u.method == "full";
      full_units += full;
      int64_t kept = 0;
      for (const auto& layer : u.head_tokens) {
        for (int64_t k : layer) {
          CHECK(k <= u.head_tokens_seen);
          if (full) CHECK(k == u.head_tokens_seen);
          kept += k;
        }
      }
      if (u.budget == "budget=32") CHECK(kept < u.head_tokens_seen * shape.n_layers * shape.n_kv_heads);
    }
    CHECK(full_units == 4);  // 2 tasks x 2 seeds
  }
  // Where the time went: every unit has its wall time; the sample's shared forward sits on
  // its first unit (the full cache, whose session is the reference itself), inside its wall.
  {
    std::set<std::string> samples_seen;
    for (const UnitRecord& u : ResultsDb::open(whole, true)->units()) {
      INFO(u.key);
      CHECK(u.wall_ms > 0);
      CHECK(u.reference_ms == 0);  // full runs first: the reference is its own session
      const bool first = samples_seen.insert(u.task + "|" + u.sample_id + "|" +
                                             std::to_string(u.seed)).second;
      CHECK(first == (u.method == "full"));
      if (first) {
        CHECK(u.shared_forward_ms > 0);
        CHECK(u.shared_forward_ms <= u.wall_ms);
      } else {
        CHECK(u.shared_forward_ms == 0);
      }
    }
    CHECK(samples_seen.size() == 4);
  }
  for (const auto& [key, value] : expected) {
    REQUIRE(value.score);  // scored by the task
    if (std::get<0>(key).find("|full") != std::string::npos) {
      CHECK(value.kl == 0.0);  // the full cache is its own reference
      CHECK(value.top1 == 1.0);
    }
  }
  // Three shards: disjoint, and together the whole sweep, row for row.
  std::vector<std::string> shards;
  std::set<std::string> seen;
  for (int32_t i = 0; i < 3; ++i) {
    shards.push_back(testing::temp_path("sweep_shard" + std::to_string(i) + ".db"));
    auto db = ResultsDb::open(shards.back());
    run_sweep(tiny_model(), c, Shard{i, 3}, *db, test_run(), nullptr);
    for (const std::string& k : db->finished_unit_keys()) CHECK(seen.insert(k).second);
  }
  CHECK(seen.size() == units);
  const std::string merged = testing::temp_path("sweep_merged.db");
  merge_results(shards, merged);
  CHECK(table_of(merged) == expected);
}

TEST_CASE("sweep: killed with SIGKILL 20 times and resumed, the table equals an uninterrupted run's",
          "[slow]") {
  // The kvbench binary on a config big enough to be killed mid-way.
  const std::string config = testing::temp_path("kill_sweep.json");
  const std::string text = R"({"tasks": ["math_find", "retr_prefix_suffix"],
    "methods": ["full", "streamingllm", "h2o", "snapkv", "tova"], "budgets": [40, 64],
    "seeds": [0, 1, 2], "samples": 2, "turns": 2, "context_tokens": 400, "max_new": 4})";
  testing::write_file(config, std::vector<uint8_t>(text.begin(), text.end()));
  auto sweep = [&](const std::string& db) {
    return std::string(KVBENCH_BINARY) + " --model " + tiny_model_path() + " --threads 1 sweep " +
           config + " --db " + db;
  };
  const std::string clean = testing::temp_path("kill_clean.db");
  const auto clean_start = std::chrono::steady_clock::now();
  REQUIRE(std::system((sweep(clean) + " >/dev/null 2>&1").c_str()) == 0);
  const double clean_ms = std::chrono::duration<double, std::milli>(
                              std::chrono::steady_clock::now() - clean_start).count();
  size_t clean_rows = 0;
  const auto expected = table_of(clean, &clean_rows);
  REQUIRE(clean_rows == 2 * 3 * 2 * 9 * 2);  // tasks x seeds x samples x methods x turns
  const size_t units = ResultsDb::open(clean, true)->finished_unit_keys().size();

  const std::string killed = testing::temp_path("kill_resumed.db");
  // Units the db holds; 0 while it does not exist or is being created.
  auto finished = [&]() -> size_t {
    try {
      return ResultsDb::open(killed, true)->finished_unit_keys().size();
    } catch (const std::exception&) {
      return 0;
    }
  };
  // Independent of the machine's speed: the moment of each kill is drawn in units of this
  // machine's own mean unit time (the clean run's, start-up included), so an attempt
  // commits a couple of units whatever the speed; and no attempt starts with fewer than
  // `reserve` units left, more than an attempt can finish in that window, so every attempt
  // is killed mid-sweep and work is left for the last run.
  const double unit_ms = clean_ms / static_cast<double>(units);
  const size_t reserve = 27;  // three samples' units
  std::mt19937 rng(12345);
  std::uniform_real_distribution<double> extra_units(0.0, 1.5);
  int attempts = 0, kills = 0;
  for (; attempts < 20 && finished() + reserve <= units; ++attempts) {
    const size_t before = finished();
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", ("exec " + sweep(killed) + " >/dev/null 2>&1").c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    // Past start-up and mid-sweep: this attempt has committed a unit. Then a random moment
    // later, inside the next unit's computation or its commit.
    int status = 0;
    bool exited = false;
    while (finished() <= before) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (!exited) {
      std::this_thread::sleep_for(
          std::chrono::microseconds(static_cast<int64_t>(1000 * unit_ms * extra_units(rng))));
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
    kills += WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  }
  INFO("clean run " << clean_ms << " ms for " << units << " units; " << attempts << " attempts");
  CHECK(kills == attempts);  // every attempt was killed mid-sweep
  CHECK(kills >= 10);        // and they were many: a unit's time apart, 20 x 2.5 units < 108
  // The kills left work for the last run: fewer units than the clean run's (not its rows).
  CHECK(finished() < units);
  REQUIRE(std::system((sweep(killed) + " >/dev/null 2>&1").c_str()) == 0);  // finish it
  size_t rows = 0;
  const auto got = table_of(killed, &rows);
  CHECK(rows == clean_rows);
  CHECK(got == expected);
}

TEST_CASE("sweep: an SCBench file is found beside its config and is part of the run's identity",
          "[unit]") {
  const std::string dir = testing::temp_path("data_config");
  std::filesystem::create_directories(dir);
  const auto write = [](const std::string& path, const std::string& text) {
    testing::write_file(path, std::vector<uint8_t>(text.begin(), text.end()));
  };
  const std::string samples = dir + "/samples.jsonl";
  write(samples, R"({"id": 0, "context": "k1: v1", "multi_turns": [{"input": "k1?", "answer": "v1"}]})"
                 "\n");
  write(dir + "/config.json",
        R"({"tasks": [{"task": "scbench_kv", "data": "samples.jsonl"}], "methods": ["full"]})");
  const SweepConfig config = load_sweep_config(dir + "/config.json");
  REQUIRE(config.tasks.size() == 1);
  CHECK(config.tasks[0].data == samples);  // the config's folder, not the working directory
  const std::string before = run_config_json(config, ModelDtype::Fp32, CpuActivations{});
  CHECK(before.find(sha256_file(samples)) != std::string::npos);
  // The same file name with other answers is another sweep: a resume or merge refuses it.
  write(samples, R"({"id": 0, "context": "k1: v2", "multi_turns": [{"input": "k1?", "answer": "v2"}]})"
                 "\n");
  CHECK(run_config_json(config, ModelDtype::Fp32, CpuActivations{}) != before);
}
