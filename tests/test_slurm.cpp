// `kvbench sweep --slurm` against a real Slurm: a one-node cluster (slurmctld, slurmd and
// munged from Debian's slurm-wlm and munge) started by scripts/slurm/local_cluster.sh in a
// temporary folder and stopped after. A sweep of SmolLM2 as a 4-task array must merge into
// the units and results of the same sweep in one process; a cancelled task is resubmitted
// alone and resumes; a failing shard keeps the merge from running and is named by --status.
// Without Slurm installed the file is skipped (exit 77), except under CI=true, where set-up
// installs it and its absence is a failure.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <thread>

#include "cli_run.h"
#include "model_path.h"
#include "store/results_db.h"

namespace kvbench {
namespace {

namespace fs = std::filesystem;
using testing::Run;
using testing::run_command;
using testing::run_kvbench;

const std::string kScript = std::string(KVBENCH_FIXTURES) + "/../../scripts/slurm/local_cluster.sh";

// The cluster, for the life of the test process; SLURM_CONF set for every client after it.
class LocalSlurm {
 public:
  LocalSlurm() : dir_(fs::temp_directory_path() / ("kvbench-slurm-" + std::to_string(getpid()))) {
    const char* ci = std::getenv("CI");
    if (run_command("command -v slurmctld slurmd munged sbatch").exit_code != 0) {
      if (ci && std::string(ci) == "true") {
        FAIL("Slurm is not installed, and CI must run this test (scripts/setup.sh installs it)");
      }
      std::printf("slurm-wlm or munge not installed (scripts/setup.sh installs them): skipped\n");
      std::exit(77);
    }
    fs::remove_all(dir_);
    const Run start = run_command(kScript + " start " + dir_.string());
    INFO(start.output);
    REQUIRE(start.exit_code == 0);
    setenv("SLURM_CONF", (dir_ / "slurm.conf").c_str(), 1);
  }
  ~LocalSlurm() {
    // Not run_command: its REQUIRE cannot run after Catch2's session, when this does.
    const std::string stop = "'" + kScript + "' stop '" + dir_.string() + "' >/dev/null 2>&1";
    if (std::system(stop.c_str()) != 0) std::fprintf(stderr, "local_cluster.sh stop failed\n");
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

LocalSlurm& cluster() {
  static LocalSlurm slurm;
  return slurm;
}

bool wait_for(const std::function<bool()>& done, int seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return done();
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// 2 tasks x 4 samples x 2 methods = 16 units, 4 a shard (2 samples x 2 methods).
std::string sweep_config() {
  return testing::write_text("slurm_sweep.json", R"({"tasks": ["retr_kv", "math_find"],
    "methods": ["full", "snapkv"], "budgets": [64], "modes": ["multi-turn"], "samples": 4,
    "turns": 2, "context_tokens": 256, "max_new": 12})");
}

std::string sweep_args(const std::string& model, const std::string& config) {
  return "--model " + model + " --threads 1 sweep " + config;
}

std::map<std::string, UnitRecord> units_of(const std::string& db) {
  std::map<std::string, UnitRecord> by_key;
  for (UnitRecord& u : ResultsDb::open(db, true)->units()) by_key[u.key] = std::move(u);
  return by_key;
}

// The same units with the same predictions, scores and bytes (timings aside).
void require_same_results(const std::string& one, const std::string& merged) {
  const auto a = units_of(one), b = units_of(merged);
  REQUIRE(a.size() == 16);
  REQUIRE(b.size() == a.size());
  for (const auto& [key, u] : a) {
    INFO(key);
    REQUIRE(b.count(key) == 1);
    const UnitRecord& v = b.at(key);
    REQUIRE(u.turns.size() == v.turns.size());
    for (size_t t = 0; t < u.turns.size(); ++t) {
      CHECK(u.turns[t].prediction == v.turns[t].prediction);
      CHECK(u.turns[t].score == v.turns[t].score);
      CHECK(u.turns[t].kv_bytes == v.turns[t].kv_bytes);
    }
  }
}

// The one-process run every Slurm run is compared with (made once).
const std::string& one_process_db(const std::string& model, const std::string& config) {
  static const std::string db = [&] {
    const std::string path = testing::temp_path("slurm_one.db");
    std::remove(path.c_str());
    const Run run = run_kvbench(sweep_args(model, config) + " --db " + path);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    return path;
  }();
  return db;
}

bool merge_finished(const fs::path& dir) { return read_text(dir / "status/merge.exit") == "0\n"; }

std::string status(const std::string& model, const std::string& config, const fs::path& dir,
                   int* exit_code = nullptr) {
  const Run run = run_kvbench(sweep_args(model, config) + " --slurm " + dir.string() + " --status");
  if (exit_code) *exit_code = run.exit_code;
  return run.output;
}

TEST_CASE("slurm: a sweep as a 4-task array merges into what one process writes") {
  cluster();
  const std::string model = testing::model_path_or_skip();
  const std::string config = sweep_config();
  const std::string one = one_process_db(model, config);
  const fs::path dir = cluster().dir() / "whole";
  const Run submit =
      run_kvbench(sweep_args(model, config) + " --slurm " + dir.string() + " --shards 4");
  INFO(submit.output);
  REQUIRE(submit.exit_code == 0);
  CHECK(submit.output.find("shards 0-3 of 4 submitted as array job") != std::string::npos);
  REQUIRE(wait_for([&] { return merge_finished(dir); }, 600));
  require_same_results(one, (dir / "merged.db").string());
  CHECK(fs::exists(dir / "report/leaderboard.md"));
  // Every shard wrote with this commit and model: one run row each, the same provenance.
  const auto runs = ResultsDb::open((dir / "merged.db").string(), true)->runs();
  REQUIRE(runs.size() == 4);
  for (const RunRecord& r : runs) {
    CHECK(r.git_sha == runs[0].git_sha);
    CHECK(r.model_sha256 == runs[0].model_sha256);
    CHECK(r.config_json == runs[0].config_json);
  }
  int code = -1;
  const std::string listed = status(model, config, dir, &code);
  INFO(listed);
  CHECK(code == 0);
  CHECK(listed.find("3      done           4/4") != std::string::npos);
  CHECK(listed.find("merge  done") != std::string::npos);
  // Again: nothing is left to submit.
  const Run again =
      run_kvbench(sweep_args(model, config) + " --slurm " + dir.string() + " --shards 4");
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK(again.output.find("nothing to submit") != std::string::npos);
}

TEST_CASE("slurm: a cancelled shard is resubmitted alone, resumes, and the merge is whole") {
  cluster();
  const std::string model = testing::model_path_or_skip();
  const std::string config = sweep_config();
  const std::string one = one_process_db(model, config);
  const fs::path dir = cluster().dir() / "cancelled";
  const Run submit =
      run_kvbench(sweep_args(model, config) + " --slurm " + dir.string() + " --shards 4");
  INFO(submit.output);
  REQUIRE(submit.exit_code == 0);
  const std::string job = submit.output.substr(submit.output.find("array job ") + 10);
  const std::string array = job.substr(0, job.find(' '));
  // Cancelled once shard 1 has written a unit and not all four.
  const std::string shard_db = (dir / "shard-1.db").string();
  const auto written = [&] {
    const Run n = run_command("sqlite3 " + shard_db + " 'select count(*) from units'");
    return n.exit_code == 0 ? std::atoi(n.output.c_str()) : 0;
  };
  REQUIRE(wait_for([&] { return written() >= 1; }, 300));
  REQUIRE(run_command("scancel " + array + "_1").exit_code == 0);
  // The others finish; the merge is cancelled by its dependency.
  REQUIRE(wait_for(
      [&] { return status(model, config, dir).find("merge  cancelled") != std::string::npos; },
      300));
  const int left = written();
  INFO("units of shard 1 before the rerun: " << left);
  REQUIRE(left < 4);
  int code = -1;
  const std::string listed = status(model, config, dir, &code);
  INFO(listed);
  CHECK(code == 1);
  CHECK(listed.find("1      failed") != std::string::npos);
  const Run rerun =
      run_kvbench(sweep_args(model, config) + " --slurm " + dir.string() + " --shards 4");
  INFO(rerun.output);
  REQUIRE(rerun.exit_code == 0);
  CHECK(rerun.output.find("shards 1 of 4 submitted") != std::string::npos);
  REQUIRE(wait_for([&] { return merge_finished(dir); }, 600));
  CHECK(read_text(dir / "logs/shard-1.log").find(std::to_string(left) + " already there") !=
        std::string::npos);
  require_same_results(one, (dir / "merged.db").string());
}

TEST_CASE("slurm: a failing shard keeps the merge from running and is named by --status") {
  cluster();
  const std::string model = testing::model_path_or_skip();
  const std::string config = sweep_config();
  const fs::path dir = cluster().dir() / "failing";
  fs::create_directories(dir);
  std::ofstream(dir / "shard-2.db") << "not a database, written over a shard's db";
  const Run submit =
      run_kvbench(sweep_args(model, config) + " --slurm " + dir.string() + " --shards 4");
  INFO(submit.output);
  REQUIRE(submit.exit_code == 0);
  REQUIRE(wait_for(
      [&] { return status(model, config, dir).find("merge  cancelled") != std::string::npos; },
      300));
  int code = -1;
  const std::string listed = status(model, config, dir, &code);
  INFO(listed);
  CHECK(code == 1);
  CHECK(listed.find("2      failed         0/4        " + (dir / "logs/shard-2.log").string()) !=
        std::string::npos);
  CHECK(listed.find("exit 2") != std::string::npos);
  CHECK(listed.find("not a kvbench results db") != std::string::npos);
  CHECK(listed.find("0      done") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "merged.db"));
  CHECK(read_text(dir / "logs/shard-2.log").find("kvbench: error:") != std::string::npos);
}

TEST_CASE("slurm: bad uses of --slurm are one clear line, exit 2, nothing submitted") {
  cluster();
  const std::string model = testing::model_path_or_skip();
  const std::string config = sweep_config();
  const fs::path dir = cluster().dir() / "refused";
  testing::require_clear_error(run_kvbench(sweep_args(model, config) + " --slurm " + dir.string()),
                               "--shards");
  testing::require_clear_error(
      run_kvbench(sweep_args(model, config) + " --slurm " + dir.string() + " --status"),
      "no submission");
  testing::require_clear_error(
      run_kvbench(sweep_args(model, config) + " --slurm " + dir.string() + " --shards 2 --jobs 2"),
      "--slurm");
  testing::require_clear_error(run_kvbench(sweep_args(model, config) + " --shards 2"), "--slurm");
  // A folder of one sweep refuses another (here: another shard count).
  const Run first = run_kvbench(sweep_args(model, config) + " --slurm " + dir.string() +
                                " --shards 2 --sbatch-option=--hold");
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  testing::require_clear_error(
      run_kvbench(sweep_args(model, config) + " --slurm " + dir.string() + " --shards 3"),
      "another sweep");
  fs::create_directories(cluster().dir() / "corrupt");
  std::ofstream(cluster().dir() / "corrupt/submission.json") << "{\"config\": 3}";
  testing::require_clear_error(run_kvbench(sweep_args(model, config) + " --slurm " +
                                           (cluster().dir() / "corrupt").string() + " --shards 2"),
                               "not a kvbench Slurm submission");
  // An option sbatch refuses: its message, and no job recorded.
  const fs::path bad = cluster().dir() / "bad-option";
  testing::require_clear_error(run_kvbench(sweep_args(model, config) + " --slurm " + bad.string() +
                                           " --shards 2 --sbatch-option=--partition=nowhere"),
                               "sbatch refused");
  CHECK_FALSE(fs::exists(bad / "submission.json"));
  run_command("scancel --user=$(id -un)");  // the held jobs
}

}  // namespace
}  // namespace kvbench
