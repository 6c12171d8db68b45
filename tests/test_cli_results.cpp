// Results that cannot be destroyed, mixed or forged (issue 39): outputs that would overwrite
// an input, sweeps that would resume another sweep's db or share it with a second writer,
// hostile values in a valid db, files that are not files, and leftovers of failed commands.
// Each case: one line, exit 2, and nothing written or changed.
#include <catch2/catch.hpp>

#include <dirent.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_run.h"
#include "common/sha256.h"
#include "gguf_writer.h"
#include "harness/calibration.h"
#include "store/results_db.h"

using namespace kvbench;
using testing::one_unit_db;
using testing::require_clear_error;
using testing::Run;
using testing::run_kvbench;
using testing::sql_text;
using testing::file_text;
using testing::temp_path;
using testing::write_text;

namespace {


void sql(const std::string& db, const std::string& statement) {
  sqlite3* handle = nullptr;
  REQUIRE(sqlite3_open(db.c_str(), &handle) == SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(handle, statement.c_str(), nullptr, nullptr, &error);
  INFO(statement << ": " << (error ? error : ""));
  sqlite3_free(error);
  sqlite3_close(handle);
  REQUIRE(rc == SQLITE_OK);
}

// A tiny model with room for the sweep below; `seed` makes another file (another sha256).
std::string tiny_model(const std::string& name, uint32_t seed = 1) {
  testing::TinyLlamaSpec spec;
  spec.context_length = 2048;
  spec.seed = seed;
  const std::string path = temp_path(name);
  testing::write_tiny_llama_gguf(path, spec);
  return path;
}

std::string tiny_config(const std::string& name, int max_new = 3, int samples = 1) {
  return write_text(name, R"({"tasks": ["math_find"], "methods": ["full", "streamingllm"],
    "budgets": [32], "samples": )" + std::to_string(samples) +
                              R"(, "turns": 2, "context_tokens": 300, "max_new": )" +
                              std::to_string(max_new) + "}");
}

// The pids of running processes whose command line contains `needle`.
std::vector<pid_t> processes_with(const std::string& needle) {
  std::vector<pid_t> found;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return found;
  while (const dirent* entry = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(entry->d_name));
    if (pid <= 0 || pid == getpid()) continue;
    std::string cmdline = file_text("/proc/" + std::string(entry->d_name) + "/cmdline");
    for (char& c : cmdline) c = c == '\0' ? ' ' : c;
    if (cmdline.find(needle) != std::string::npos) found.push_back(pid);
  }
  closedir(proc);
  return found;
}

// A running process's parent pid, from /proc/PID/stat ("pid (comm) state ppid ..."); 0 when
// it is gone.
pid_t parent_of(pid_t pid) {
  const std::string stat = file_text("/proc/" + std::to_string(pid) + "/stat");
  const size_t comm_end = stat.rfind(')');
  pid_t ppid = 0;
  if (comm_end == std::string::npos || std::sscanf(stat.c_str() + comm_end + 1, " %*c %d", &ppid) != 1) {
    return 0;
  }
  return ppid;
}

}  // namespace

TEST_CASE("results: an output that is an input, or not a regular file, is refused", "[unit]") {
  const std::string db = one_unit_db("out_in.db", "full");
  const std::string before = file_text(db);
  SECTION("check DB --write-baseline DB, by any path to it") {
    require_clear_error(run_kvbench("check " + db + " --write-baseline " + db), "is also an input");
    const std::string dir = db.substr(0, db.find_last_of('/'));
    const std::string other_path = dir + "/./../" + dir.substr(dir.find_last_of('/') + 1) + "/out_in.db";
    require_clear_error(run_kvbench("check " + db + " --write-baseline " + other_path),
                        "is also an input");
    const std::string link = temp_path("out_in_link.json");
    std::remove(link.c_str());
    REQUIRE(symlink(db.c_str(), link.c_str()) == 0);
    require_clear_error(run_kvbench("check " + db + " --write-baseline " + link), "is also an input");
  }
  SECTION("report of a db stored as DIR/leaderboard.html into DIR") {
    const std::string dir = temp_path("out_in_dir");
    mkdir(dir.c_str(), 0755);
    const std::string inside = dir + "/leaderboard.html";
    testing::write_file(inside, testing::read_file_bytes(db));
    require_clear_error(run_kvbench("report " + inside + " -o " + dir), "is also an input");
    CHECK(file_text(inside) == before);
    CHECK_FALSE(testing::path_exists(dir + "/leaderboard.md"));
  }
  SECTION("the db named as a SQLite URI, and a symlink planted at a temporary's name") {
    const std::string dir = db.substr(0, db.find_last_of('/'));
    require_clear_error(run_kvbench("check 'file:out_in.db' --write-baseline out_in.db",
                                    "cd '" + dir + "' &&"),
                        "not a SQLite URI");
    // Temporaries are created O_EXCL under names of their own: a link at OUT.tmp (the name
    // written through before) is never followed.
    const std::string victim = temp_path("out_in_victim.txt");
    testing::write_file(victim, {'v'});
    const std::string baseline = temp_path("out_in_baseline.json");
    std::remove(baseline.c_str());
    std::remove((baseline + ".tmp").c_str());
    REQUIRE(symlink(victim.c_str(), (baseline + ".tmp").c_str()) == 0);
    REQUIRE(run_kvbench("check " + db + " --write-baseline " + baseline).exit_code == 0);
    CHECK(file_text(victim) == "v");
    CHECK(file_text(baseline).find("kvbench_baseline") != std::string::npos);
  }
  SECTION("a FIFO (or a device) as the baseline to write") {
    const std::string fifo = temp_path("out_fifo.json");
    std::remove(fifo.c_str());
    REQUIRE(mkfifo(fifo.c_str(), 0644) == 0);
    require_clear_error(run_kvbench("check " + db + " --write-baseline " + fifo),
                        "exists and is not a regular file");
    struct stat st {};
    REQUIRE(lstat(fifo.c_str(), &st) == 0);
    CHECK(S_ISFIFO(st.st_mode));  // not replaced by a regular file
    CHECK_FALSE(testing::temporary_left(fifo));
  }
  CHECK(file_text(db) == before);
}

TEST_CASE("results: inputs that are not regular files are refused, not waited on", "[unit]") {
  const std::string db = one_unit_db("fifo_inputs.db", "full");
  const std::string fifo = temp_path("input.fifo");
  std::remove(fifo.c_str());
  REQUIRE(mkfifo(fifo.c_str(), 0644) == 0);
  // `timeout`: a command that opens the FIFO would wait for a writer for ever.
  const std::string t = "timeout 60";
  require_clear_error(run_kvbench("check " + db + " --baseline " + fifo, t), "not a regular file");
  require_clear_error(run_kvbench("--model " + fifo + " generate --prompt hi", t), "not a regular file");
  require_clear_error(run_kvbench("session --sample " + fifo + " --mode multi-turn --method full", t),
                      "not a regular file");
  require_clear_error(run_kvbench("sweep " + fifo + " --db x.db", t), "not a regular file");
  // The db itself a FIFO: report, check and merge refuse it (they waited for a writer before).
  require_clear_error(run_kvbench("report " + fifo + " -o " + temp_path("fifo_report"), t),
                      "the results db is not a regular file");
  require_clear_error(run_kvbench("check " + fifo + " --write-baseline " + temp_path("f.json"), t),
                      "the results db is not a regular file");
  require_clear_error(run_kvbench("merge " + fifo + " -o " + temp_path("fifo_merged.db"), t),
                      "the results db is not a regular file");
  // A calibration file that is a link to /dev/zero: refused, not read until memory runs out.
  const std::string zero = temp_path("zero_calibration.json");
  std::remove(zero.c_str());
  REQUIRE(symlink("/dev/zero", zero.c_str()) == 0);
  const std::string model = tiny_model("tiny_zero_cal.gguf");
  require_clear_error(run_kvbench("--model " + model + " calibrate --task retr_kv --lengths 64 "
                                  "--samples 1 --turns 1 -o " + zero, t),
                      "not a regular file");
  // duo_attention's head-probe cache, outside --out under $XDG_CACHE_HOME: read as any input.
  const std::string cache_home = temp_path("fifo_cache_home");
  std::filesystem::create_directories(cache_home + "/kvbench/heads");
  const std::string probe_cache =
      cache_home + "/kvbench/heads/" + kvbench::sha256_file(model) + ".json";
  std::remove(probe_cache.c_str());
  REQUIRE(mkfifo(probe_cache.c_str(), 0644) == 0);
  require_clear_error(run_kvbench("--model " + model + " generate --prompt hi --max-new 2 "
                                  "--method duo_attention", "XDG_CACHE_HOME=" + cache_home + " " + t),
                      "head-probe cache");
}

TEST_CASE("results: 16 concurrent calibrations of one model into one file keep every cell",
          "[unit]") {
  // Each reads the file, adds its cell and writes it back under the folder's lock
  // (common/files.h FolderLock): without it, one's write drops cells another wrote meanwhile.
  const std::string model = tiny_model("tiny_two_cals.gguf");
  const std::string path = temp_path("concurrent_calibrations.json");
  std::remove(path.c_str());
  const std::vector<std::string> tasks = {"retr_kv", "retr_prefix_suffix", "math_find",
                                          "multihop_vt"};
  const std::vector<int> lengths = {300, 400, 500, 600};
  std::string all;
  for (const std::string& task : tasks) {
    for (const int length : lengths) {
      all += std::string(KVBENCH_BINARY) + " --model " + model + " --threads 1 calibrate --task " +
             task + " --lengths " + std::to_string(length) + " --samples 1 --turns 1 -o " +
             path + " > /dev/null & pids=\"$pids $!\"; ";
    }
  }
  // Every calibration's own exit code, not only the last one's.
  const Run run =
      testing::run_command(all + "failed=0; for p in $pids; do wait $p || failed=1; done; exit $failed");
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const Calibration cells = load_calibration(path);
  for (const std::string& task : tasks) {
    for (const int length : lengths) {
      INFO(task << " at " << length);
      const auto found = std::count_if(cells.cells.begin(), cells.cells.end(),
                                       [&](const CalibrationCell& c) {
                                         return c.task == task && c.context_tokens == length;
                                       });
      CHECK(found == 1);
    }
  }
  CHECK_FALSE(testing::temporary_left(path));
}

TEST_CASE("results: option values and OMP_NUM_THREADS are checked as --threads is", "[unit]") {
  require_clear_error(run_kvbench("--model '' list models"), "--model: an empty value");
  require_clear_error(run_kvbench("sweep x.json --db x.db --shard ''"), "--shard: an empty value");
  require_clear_error(run_kvbench("generate --prompt hi --temperature nan"), "finite number");
  require_clear_error(run_kvbench("generate --prompt hi --temperature inf"), "--temperature");
  require_clear_error(run_kvbench("generate --prompt hi --seed -1"), "[0, 2^64)");
  require_clear_error(run_kvbench("generate --prompt hi --seed 18446744073709551616"), "[0, 2^64)");
  const std::string db = one_unit_db("tolerance.db", "full");
  const std::string baseline = temp_path("tolerance.json");
  REQUIRE(run_kvbench("check " + db + " --write-baseline " + baseline).exit_code == 0);
  for (const char* bad : {"accuracy=inf", "accuracy=0x10", "speed=nan"}) {
    require_clear_error(run_kvbench("check " + db + " --baseline " + baseline + " --tolerance " + bad),
                        "decimal number");
  }
  // It crashed in the model's load (SIGSEGV) before.
  require_clear_error(run_kvbench("list methods", "OMP_NUM_THREADS=100000"), "OMP_NUM_THREADS");
}

TEST_CASE("results: a sweep refuses a db of another config or model, before loading", "[unit]") {
  const std::string model = tiny_model("tiny_resume.gguf");
  const std::string db = temp_path("resume.db");
  std::remove(db.c_str());
  const std::string sweep = "--model " + model + " --threads 1 sweep ";
  const Run first = run_kvbench(sweep + tiny_config("resume_a.json") + " --db " + db);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  const std::string runs = sql_text(db, "SELECT count(*) || '/' || (SELECT count(*) FROM units) FROM runs");
  require_clear_error(run_kvbench(sweep + tiny_config("resume_b.json", 4) + " --db " + db),
                      "holds run 1 of another config");
  const std::string other = tiny_model("tiny_resume_other.gguf", 2);
  require_clear_error(run_kvbench("--model " + other + " --threads 1 sweep " +
                                  tiny_config("resume_a.json") + " --db " + db),
                      "of another model");
  CHECK(sql_text(db, "SELECT count(*) || '/' || (SELECT count(*) FROM units) FROM runs") == runs);
  // The same config resumes as before.
  const Run again = run_kvbench(sweep + tiny_config("resume_a.json") + " --db " + db);
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK(again.output.find("0 units written") != std::string::npos);
}

TEST_CASE("results: a second sweep on a db another sweep is writing is refused at once", "[unit]") {
  const std::string model = tiny_model("tiny_locked.gguf");
  const std::string db = one_unit_db("locked.db", "full");
  sql(db, "DELETE FROM results; DELETE FROM units; DELETE FROM runs;");
  // This process holds the writer lock, as a running sweep does.
  const int fd = ::open(db.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(flock(fd, LOCK_EX | LOCK_NB) == 0);
  const Run second =
      run_kvbench("--model " + model + " --threads 1 sweep " + tiny_config("locked.json") + " --db " + db);
  // The workers' variable naming a descriptor of the db that holds no lock is no way around it.
  const Run bypass = run_kvbench("--model " + model + " --threads 1 sweep " +
                                     tiny_config("locked.json") + " --db " + db + " 7<" + db,
                                 "KVBENCH_DB_LOCK_FD=7");
  ::close(fd);
  require_clear_error(second, "another kvbench sweep is writing this results db");
  require_clear_error(bypass, "another kvbench sweep is writing this results db");
  CHECK(sql_text(db, "SELECT count(*) FROM runs") == "0");  // no unfinished run row left
}

TEST_CASE("results: sweep --jobs workers die with their parent, whatever kills it", "[slow]") {
  // SIGTERM: the parent forwards it and waits; SIGKILL and SIGHUP it cannot see: the workers
  // die of their parent-death signal (they kept writing the db before).
  const int killer = GENERATE(SIGTERM, SIGKILL, SIGHUP);
  INFO("signal " << killer);
  const std::string model = tiny_model("tiny_sigterm.gguf");
  const std::string db = temp_path("sigterm_jobs_" + std::to_string(killer) + ".db");
  std::remove(db.c_str());
  // Long enough to be running when the signal comes (40 samples took about a second once
  // kvbench started in 0.1 s rather than 0.7), and for an orphaned worker to be still running
  // seconds later.
  const std::string config = tiny_config("sigterm.json", 3, 1200);
  const pid_t parent = fork();
  REQUIRE(parent >= 0);
  if (parent == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    dup2(null, 1);
    dup2(null, 2);
    execl(KVBENCH_BINARY, "kvbench", "--model", model.c_str(), "--threads", "1", "sweep",
          config.c_str(), "--db", db.c_str(), "--jobs", "2", static_cast<char*>(nullptr));
    _exit(127);
  }
  // The sweep's workers: its own children whose command line names the db and a shard. A
  // worker's child (popen's shell, for the run's git commit, before its exec) carries the same
  // command line for a moment: its parent is the worker, not the sweep.
  const auto workers = [&db, parent] {
    std::vector<pid_t> w;
    for (pid_t pid : processes_with(db)) {
      if (parent_of(pid) == parent &&
          file_text("/proc/" + std::to_string(pid) + "/cmdline").find("--shard") != std::string::npos) {
        w.push_back(pid);
      }
    }
    return w;
  };
  for (int i = 0; i < 300 && workers().size() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::vector<pid_t> started = workers();
  REQUIRE(started.size() == 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  REQUIRE(kill(parent, killer) == 0);
  int status = 0;
  REQUIRE(waitpid(parent, &status, 0) == parent);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == killer);
  // None is left writing (an orphan would be the init process's child by now, so each
  // started worker is looked up by its pid): at once after SIGTERM, which the parent waited
  // out, within 2 s after the others (an orphan went on for many more).
  const auto running = [&](pid_t pid) {
    return file_text("/proc/" + std::to_string(pid) + "/cmdline").find("--shard") != std::string::npos;
  };
  for (int i = 0; i < 20 && killer != SIGTERM &&
                  std::any_of(started.begin(), started.end(), running);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (const pid_t pid : started) {
    INFO("worker " << pid);
    CHECK_FALSE(running(pid));
  }
}

TEST_CASE("results: hostile values in a valid db name the db, table, column and row", "[unit]") {
  struct Case {
    const char* edit;
    const char* named;
  };
  const Case cases[] = {
      {"UPDATE results SET turn = 2147483647", "results.turn of row 1"},
      {"UPDATE results SET turn = 4294967297", "results.turn of row 1"},
      {"UPDATE results SET ttft_ms = 'abc'", "results.ttft_ms of row 1: not a number"},
      {"UPDATE results SET score = 7", "results.score of row 1"},
      {"UPDATE results SET score = 9e999", "results.score of row 1"},
      {"UPDATE results SET kv_bytes = -5", "results.kv_bytes of row 1"},
      {"UPDATE results SET prediction = x'00ff'", "results.prediction of row 1: not text"},
      {"UPDATE units SET head_tokens = '[[' || substr(replace(hex(zeroblob(400000)), '00', "
       "'1,'), 1, 1600000) || '1]]'",
       "units.head_tokens of row 1"},
      {"UPDATE units SET context_tokens = -1", "units.context_tokens of row 1"},
      // The same unit again under a second key would count twice in every mean.
      {"INSERT INTO units (run_id, unit_key, task, sample_id, method, budget, mode, seed, "
       "context_tokens, context_prefill_ms, finished_at) SELECT run_id, 'copy', task, sample_id, "
       "method, budget, mode, seed, context_tokens, context_prefill_ms, finished_at FROM units",
       "units.unit_key of row 2: unit copy repeats unit"},
  };
  for (const Case& c : cases) {
    INFO(c.edit);
    const std::string db = one_unit_db("hostile_values.db", "full");
    sql(db, c.edit);
    const std::string out = temp_path("hostile_values_out");
    const std::string merged = temp_path("hostile_values_merged.db");
    std::remove(merged.c_str());
    std::remove((out + ".json").c_str());
    require_clear_error(run_kvbench("report " + db + " -o " + out), c.named);
    require_clear_error(run_kvbench("check " + db + " --write-baseline " + out + ".json"), c.named);
    require_clear_error(run_kvbench("merge " + db + " -o " + merged), c.named);
    CHECK_FALSE(testing::path_exists(out + "/leaderboard.html"));
    CHECK_FALSE(testing::path_exists(out + ".json"));
    CHECK_FALSE(testing::path_exists(merged));
    CHECK_FALSE(testing::path_exists(merged + ".partial"));
  }
  // The runs table is read by report and merge (check reads only the units).
  const std::string db = one_unit_db("hostile_runs.db", "full");
  sql(db, "UPDATE runs SET config_json = x'7b7d'");
  require_clear_error(run_kvbench("report " + db + " -o " + temp_path("hostile_runs_out")),
                      "runs.config_json of row 1: not text");
  const std::string merged = temp_path("hostile_runs_merged.db");
  std::remove(merged.c_str());
  require_clear_error(run_kvbench("merge " + db + " -o " + merged), "runs.config_json of row 1");
}

TEST_CASE("results: calibration files with impossible cells are refused", "[unit]") {
  const std::string model = tiny_model("tiny_bad_cal.gguf");
  const std::string cell =
      R"({"task": "retr_kv", "context_tokens": 64, "samples": 1, "turns": 1, "seconds": 1, )";
  const auto file = [&](const std::string& cells, const std::string& head = "") {
    return R"({"model": "tiny_bad_cal.gguf", "model_sha256": "x", "mode": "multi-turn", )" + head +
           R"("seed": 0, "cells": [)" + cells + "]}";
  };
  const std::string good = cell + R"("accuracy": 0.5, "low": 0.2, "high": 0.8})";
  struct Case {
    std::string text, named;
  };
  const Case cases[] = {
      {file(cell + R"("accuracy": 7.5, "low": 0, "high": 1})"), "accuracy must lie in its interval"},
      {file(cell + R"("accuracy": -5, "low": 0, "high": 1})"), "accuracy must lie in its interval"},
      {file(cell + R"("accuracy": 0.5, "low": 0.9, "high": 0.1})"), "accuracy must lie in its interval"},
      {file(good + ", " + good), "a second cell for retr_kv at 64 tokens"},
      {file(good, R"("seed": 1, )"), "JSON key \"seed\" given twice"},
      {R"({"model": "tiny_bad_cal.gguf", "model_sha256": "x", "mode": "multi-request", "seed": 0, "cells": []})",
       "mode 'multi-request'"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    const std::string path = write_text("bad_calibration.json", c.text);
    require_clear_error(run_kvbench("--model " + model + " calibrate --task retr_kv --lengths 64 "
                                    "--samples 1 --turns 1 -o " + path),
                        c.named);
    CHECK(file_text(path) == c.text);  // not rewritten
  }
}

TEST_CASE("results: failed commands leave nothing behind, and check before working", "[unit]") {
  // A method name of 200 KB: its baseline and a merge of it pass the file size limit below,
  // which leaves room for SQLite's 32 KiB -shm file.
  const std::string db = one_unit_db("leftovers.db", "full:" + std::string(200000, 'x'));
  const std::string limit = "trap '' XFSZ; ulimit -f 128;";  // writes past it fail (EFBIG)
  SECTION("a baseline write that fails midway (file size limit) leaves no .tmp") {
    const std::string baseline = temp_path("leftover_baseline.json");
    std::remove(baseline.c_str());
    const Run run = run_kvbench("check " + db + " --write-baseline " + baseline, limit);
    require_clear_error(run, baseline);
    CHECK_FALSE(testing::path_exists(baseline));
    CHECK_FALSE(testing::temporary_left(baseline));
  }
  SECTION("a report that fails midway leaves the old pair of files, not a new one beside an old") {
    const std::string dir = temp_path("leftover_report");
    std::filesystem::create_directories(dir);
    testing::write_file(dir + "/leaderboard.md", {'m'});
    testing::write_file(dir + "/leaderboard.html", {'h'});
    // A file size limit between the two files' sizes: the Markdown fits, the HTML does not.
    const std::string scratch = temp_path("leftover_report_sizes");
    REQUIRE(run_kvbench("report " + db + " -o " + scratch).exit_code == 0);
    const auto md_size = std::filesystem::file_size(scratch + "/leaderboard.md");
    const auto html_size = std::filesystem::file_size(scratch + "/leaderboard.html");
    REQUIRE(html_size > md_size + 4096);
    const std::string between =  // sh's ulimit -f counts 512-byte blocks
        "trap '' XFSZ; ulimit -f " + std::to_string((md_size + html_size) / 2 / 512) + ";";
    const Run run = run_kvbench("report " + db + " -o " + dir, between);
    require_clear_error(run, "leaderboard.html: cannot write the report");
    CHECK(file_text(dir + "/leaderboard.md") == "m");
    CHECK(file_text(dir + "/leaderboard.html") == "h");
    CHECK_FALSE(testing::temporary_left(dir + "/leaderboard.md"));
  }
  SECTION("a sweep refused after its db was made (a model that is no model) removes it") {
    const std::string fresh = temp_path("leftover_sweep.db");
    std::remove(fresh.c_str());
    const std::string fake = write_text("leftover_fake.gguf", "not a model");
    require_clear_error(run_kvbench("--model " + fake + " sweep " + tiny_config("leftover.json") +
                                    " --db " + fresh),
                        "leftover_fake.gguf");
    CHECK_FALSE(testing::path_exists(fresh));
    CHECK_FALSE(testing::path_exists(fresh + "-wal"));
  }
  SECTION("OMP_STACKSIZE past what threads can have is an input error, not exit 1") {
    require_clear_error(run_kvbench("list methods", "OMP_STACKSIZE=100000G"), "OMP_STACKSIZE");
  }
  SECTION("merge -o with a name too long for the file system says so") {
    require_clear_error(run_kvbench("merge " + db + " -o " + temp_path(std::string(300, 'n'))),
                        "File name too long");
  }
  SECTION("a merge that fails midway leaves no db to block the next one") {
    const std::string merged = temp_path("leftover_merged.db");
    std::remove(merged.c_str());
    testing::write_file(merged + ".partial", {'s', 't', 'a', 'l', 'e'});  // a killed merge's
    const Run failed = run_kvbench("merge " + db + " -o " + merged, limit);
    INFO(failed.output);
    CHECK(failed.exit_code == 2);
    CHECK_FALSE(testing::path_exists(merged));
    CHECK_FALSE(testing::path_exists(merged + ".partial"));
    const Run again = run_kvbench("merge " + db + " -o " + merged);
    INFO(again.output);
    CHECK(again.exit_code == 0);
    CHECK(ResultsDb::open(merged, true)->units().size() == 1);
  }
  SECTION("calibrate -o into a path that cannot be written fails before any cell") {
    const std::string model = tiny_model("tiny_cal_out.gguf");
    const std::string blocker = write_text("not_a_dir", "x");
    require_clear_error(run_kvbench("--model " + model + " calibrate --task retr_kv --lengths 64 "
                                    "--samples 1 --turns 1 -o " + blocker + "/cal.json"),
                        "cannot write the calibration file");
  }
  SECTION("calibrate --lengths past the model's window is refused before a sample is built") {
    const std::string model = tiny_model("tiny_cal_long.gguf");
    const std::string out = temp_path("cal_long.json");
    std::remove(out.c_str());
    // `timeout 60`: building the 16M-token sample first took 30 s and gigabytes.
    require_clear_error(run_kvbench("--model " + model + " calibrate --task retr_kv --lengths "
                                    "16777216 --samples 1 --turns 1 -o " + out, "timeout 60"),
                        "--lengths 16777216: not shorter than the model's context window");
    CHECK_FALSE(testing::path_exists(out));
  }
  SECTION("a sweep refused over its calibration creates no db") {
    const std::string model = tiny_model("tiny_uncalibrated.gguf");
    const std::string config = write_text("needs_calibration.json", R"({"tasks": ["retr_kv"],
      "methods": ["full"], "samples": 1, "turns": 1, "context_tokens": 64,
      "min_full_accuracy": 0.8})");
    const std::string fresh = temp_path("refused_sweep.db");
    std::remove(fresh.c_str());
    require_clear_error(run_kvbench("--model " + model + " sweep " + config + " --db " + fresh),
                        "calibration");
    CHECK_FALSE(testing::path_exists(fresh));
  }
  SECTION("a foreign db with kvbench's table names is refused before it is switched to WAL") {
    const std::string foreign = temp_path("foreign_tables.db");
    std::remove(foreign.c_str());
    sql(foreign, "PRAGMA user_version = " + std::to_string(kResultsSchemaVersion) +
                     "; CREATE TABLE runs(x); CREATE TABLE units(y); CREATE TABLE results(z);");
    const std::string model = tiny_model("tiny_foreign.gguf");
    require_clear_error(run_kvbench("--model " + model + " sweep " + tiny_config("foreign.json") +
                                    " --db " + foreign),
                        "not a kvbench results db");
    CHECK(sql_text(foreign, "PRAGMA journal_mode") == "delete");
  }
  SECTION("merge's error for a repeated unit is short and names both inputs") {
    const std::string copy = temp_path("leftovers_copy.db");
    testing::write_file(copy, testing::read_file_bytes(db));
    const std::string merged = temp_path("dup_merged.db");
    std::remove(merged.c_str());
    const Run run = run_kvbench("merge " + db + " " + copy + " -o " + merged);
    require_clear_error(run, "is also in " + db);
    CHECK(run.output.size() < 300);
    CHECK(run.output.find("INSERT") == std::string::npos);
  }
}

TEST_CASE("results: a WAL db on a read-only mount is read", "[unit]") {
  // A mount namespace of our own (unshare -rm: no privileges needed where user namespaces
  // are allowed); skipped where it cannot be made.
  if (std::system("unshare -rm true 2>/dev/null") != 0) {
    WARN("unshare -rm is not allowed here: skipped");
    return;
  }
  const std::string db = one_unit_db("wal_ro.db", "full");
  sql(db, "PRAGMA journal_mode = WAL");
  const std::string mount = temp_path("ro_mount");
  mkdir(mount.c_str(), 0755);
  const std::string baseline = temp_path("wal_ro.json");
  std::remove(baseline.c_str());
  const std::string script = "mount -t tmpfs none " + mount + " && cp " + db + " " + mount +
                             "/ && mount -o remount,ro " + mount + " && " + KVBENCH_BINARY +
                             " check " + mount + "/wal_ro.db --write-baseline " + baseline;
  const Run run = testing::run_command("unshare -rm sh -c '" + script + "'");
  INFO(run.output);
  CHECK(run.exit_code == 0);
  CHECK(testing::path_exists(baseline));
}
