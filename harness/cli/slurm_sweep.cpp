#include "harness/cli/slurm_sweep.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/files.h"
#include "common/input_error.h"
#include "common/subprocess.h"
#include "harness/cli/prepared_sweep.h"
#include "harness/model/gguf.h"
#include "harness/model/hf_folder.h"
#include "harness/model/model_config.h"
#include "harness/model/tokenizer.h"
#include "harness/sweep.h"
#include "store/run_identity.h"

namespace kvbench {

namespace {

namespace fs = std::filesystem;

// Where a submission keeps its files, all under one folder that every node sees.
struct SlurmDir {
  std::string root;  // absolute
  std::string submission() const { return root + "/submission.json"; }
  std::string shard_db(int i) const { return root + "/shard-" + std::to_string(i) + ".db"; }
  std::string shard_log(int i) const { return root + "/logs/shard-" + std::to_string(i) + ".log"; }
  // What a shard's task exited with, written by its script when it ends (Slurm forgets
  // finished jobs after MinJobAge; without accounting, this file remembers).
  std::string shard_exit(int i) const {
    return root + "/status/shard-" + std::to_string(i) + ".exit";
  }
  std::string shard_script() const { return root + "/shard.sh"; }
  std::string merge_script() const { return root + "/merge.sh"; }
  std::string merge_log() const { return root + "/logs/merge.log"; }
  std::string merge_exit() const { return root + "/status/merge.exit"; }
  std::string merged_db() const { return root + "/merged.db"; }
  std::string report() const { return root + "/report"; }
};

// DIR/submission.json: which sweep this folder holds and the jobs submitted for it.
struct Submission {
  std::string config_path;
  int32_t shards = 0;
  std::string run_config;  // RunRecord::config_json: a rerun must be the same sweep
  std::string model_sha256;
  std::vector<std::string> array_jobs;  // oldest first
  std::string merge_job;
};

Submission read_submission(const std::string& path) {
  const std::string text = read_regular_file(path, "Slurm submission", uint64_t{1} << 20);
  const auto bad = [&](const std::string& why) {
    return InputError(path + ": not a kvbench Slurm submission (" + why +
                      "); remove the folder's files or use another --slurm folder");
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw bad("not JSON");
  }
  Submission s;
  try {
    s.config_path = j.at("config").get<std::string>();
    s.shards = j.at("shards").get<int32_t>();
    s.run_config = j.at("run_config").get<std::string>();
    s.model_sha256 = j.at("model_sha256").get<std::string>();
    s.array_jobs = j.at("array_jobs").get<std::vector<std::string>>();
    s.merge_job = j.at("merge_job").get<std::string>();
  } catch (const nlohmann::json::exception&) {
    throw bad("a field is missing or of the wrong type");
  }
  if (s.shards < 1 || s.shards > 100000) throw bad("shards out of range");
  return s;
}

void write_submission(const std::string& path, const Submission& s) {
  const nlohmann::json j = {{"config", s.config_path},    {"shards", s.shards},
                            {"run_config", s.run_config}, {"model_sha256", s.model_sha256},
                            {"array_jobs", s.array_jobs}, {"merge_job", s.merge_job}};
  write_file_atomically(path, j.dump(2) + "\n", "Slurm submission");
}

// A word for a shell script: single-quoted, so that nothing in it is expanded.
std::string shell_quote(const std::string& word) {
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string shell_line(const std::vector<std::string>& words) {
  std::string line;
  for (const std::string& w : words) line += (line.empty() ? "" : " ") + shell_quote(w);
  return line;
}

ProcessResult run_slurm_tool(const std::vector<std::string>& argv) {
  ProcessResult r = run_process(argv);
  if (r.exit_code == 127 && r.out.empty()) {
    throw InputError("--slurm: " + argv[0] +
                     " not found: run on a Slurm submit host (slurm-wlm; a one-node cluster for "
                     "trying: scripts/slurm/local_cluster.sh)");
  }
  return r;
}

std::string first_line(const std::string& text) {
  std::string line = text.substr(0, text.find('\n'));
  return line.empty() ? "no message" : line;
}

// The Slurm states of this submission's jobs that slurmctld still knows: "12_3" (an array
// task) or "13" (the merge job) to "RUNNING", "PENDING", "FAILED", "CANCELLED", ...
std::map<std::string, std::string> queue_states(const Submission& s) {
  std::set<std::string> ours(s.array_jobs.begin(), s.array_jobs.end());
  if (!s.merge_job.empty()) ours.insert(s.merge_job);
  std::map<std::string, std::string> states;
  if (ours.empty()) return states;
  const ProcessResult r = run_slurm_tool({"squeue", "-h", "-r", "-t", "all", "-o", "%i|%T"});
  if (r.exit_code != 0) throw InputError("--slurm: squeue failed: " + first_line(r.err));
  size_t at = 0;
  while (at < r.out.size()) {
    const size_t end = std::min(r.out.find('\n', at), r.out.size());
    const std::string line = r.out.substr(at, end - at);
    at = end + 1;
    const size_t bar = line.find('|');
    if (bar == std::string::npos) continue;
    const std::string id = line.substr(0, bar);
    if (ours.count(id.substr(0, id.find('_')))) states[id] = line.substr(bar + 1);
  }
  return states;
}

bool queued_or_running(const std::string& state) {
  return state == "PENDING" || state == "RUNNING" || state == "CONFIGURING" ||
         state == "COMPLETING" || state == "SUSPENDED" || state == "REQUEUED" ||
         state == "REQUEUE_HOLD" || state == "RESIZING";
}

std::string read_exit_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return "";
  try {
    std::string text = read_regular_file(path, "exit status", 64);
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    return text;
  } catch (const InputError&) {
    return "";
  }
}

enum class ShardState { Done, Pending, Running, Failed, Stopped, NotSubmitted };

const char* state_name(ShardState s) {
  switch (s) {
    case ShardState::Done:
      return "done";
    case ShardState::Pending:
      return "pending";
    case ShardState::Running:
      return "running";
    case ShardState::Failed:
      return "failed";
    case ShardState::Stopped:
      return "stopped";
    case ShardState::NotSubmitted:
      return "not submitted";
  }
  return "?";
}

struct ShardStatus {
  ShardState state = ShardState::NotSubmitted;
  int64_t written = 0;  // units of its plan its db holds
  int64_t planned = 0;
  std::string detail;  // why it failed or stopped
  std::string task;    // "12_3", its latest array task Slurm still knows
};

ShardStatus shard_status(int i, const ShardPlan& plan, const SlurmDir& dir, const Submission& s,
                         const std::map<std::string, std::string>& queue) {
  ShardStatus st;
  st.planned = static_cast<int64_t>(plan.unit_keys.size());
  std::error_code ec;
  if (fs::exists(dir.shard_db(i), ec)) {
    try {
      const std::set<std::string> finished =
          ResultsDb::open(dir.shard_db(i), true)->finished_unit_keys();
      for (const std::string& key : plan.unit_keys) st.written += finished.count(key);
    } catch (const InputError& e) {
      st.detail = e.what();
    }
  }
  if (st.detail.empty() && st.written == st.planned) {
    st.state = ShardState::Done;
    return st;
  }
  for (auto job = s.array_jobs.rbegin(); job != s.array_jobs.rend(); ++job) {
    const auto q = queue.find(*job + "_" + std::to_string(i));
    if (q == queue.end()) continue;
    st.task = q->first;
    if (q->second == "PENDING") {
      st.state = ShardState::Pending;
    } else if (queued_or_running(q->second)) {
      st.state = ShardState::Running;
    } else {
      st.state = ShardState::Failed;
      const std::string code = read_exit_file(dir.shard_exit(i));
      st.detail = q->second + (code.empty() ? "" : ", exit " + code) +
                  (st.detail.empty() ? "" : ": " + st.detail);
    }
    return st;
  }
  const std::string code = read_exit_file(dir.shard_exit(i));
  if (!code.empty()) {
    st.state = ShardState::Failed;
    st.detail = "exit " + code + (st.detail.empty() ? "" : ": " + st.detail);
  } else if (!s.array_jobs.empty()) {
    st.state = ShardState::Stopped;
    if (st.detail.empty()) st.detail = "not in the queue, no exit status";
  }
  return st;
}

// Slurm's time form for `minutes`: "D-HH:MM:00" or "HH:MM:00".
std::string slurm_time(int64_t minutes) {
  char text[32];
  const int64_t days = minutes / (24 * 60), hours = (minutes / 60) % 24, mins = minutes % 60;
  if (days > 0) {
    std::snprintf(text, sizeof text, "%lld-%02lld:%02lld:00", static_cast<long long>(days),
                  static_cast<long long>(hours), static_cast<long long>(mins));
  } else {
    std::snprintf(text, sizeof text, "%02lld:%02lld:00", static_cast<long long>(hours),
                  static_cast<long long>(mins));
  }
  return text;
}

// The time limit of a shard: the calibration's estimate of the longest shard, doubled (the
// estimate times the full cache, with a prefill for each unit that prefills on its own;
// methods that score or rebuild the cache take longer), plus 15 minutes for loading and the first prefill. Units of tasks
// without a calibration cell count at the timed units' average. Without a calibration:
// 24 hours, said so.
std::string shard_time_limit(const std::vector<ShardPlan>& plans, const PreparedSweep& p,
                             std::string* why) {
  const Calibration* timings = p.calibration && p.calibration->model_sha256 == p.run.model_sha256
                                   ? &*p.calibration
                                   : nullptr;
  if (timings == nullptr) {
    *why = "no calibration of this model file to estimate from: 24 hours (--time to set it)";
    return slurm_time(24 * 60);
  }
  double longest = 0;
  for (const ShardPlan& plan : plans) {
    const SweepEstimate e = estimate_sweep(plan.planned, *timings);
    int64_t units = 0;
    for (const PlannedUnits& u : plan.planned) units += u.units;
    double seconds = e.seconds;
    if (e.timed_units > 0 && e.timed_units < units) {
      seconds *= static_cast<double>(units) / static_cast<double>(e.timed_units);
    } else if (e.timed_units == 0 && units > 0) {
      *why = "no calibration timing for this sweep's tasks: 24 hours (--time to set it)";
      return slurm_time(24 * 60);
    }
    longest = std::max(longest, seconds);
  }
  *why = "the longest shard estimated at " + duration_text(longest) + ", doubled, plus 15 minutes";
  return slurm_time(static_cast<int64_t>(std::ceil(2 * longest / 60)) + 15);
}

// Memory of a shard's task, in MiB: the model file, its weights again as fp32 (the prefill
// GEMMs' dequantized copies) and as int8 packs when prefill runs on int8 activations, the
// fp32 cache of the longest conversation four times (the shared prefill's, the full
// reference's, the method's, and a copy a method may build), and 1 GiB for the process, the
// samples and the scratch of a prefill. Measured (docs/cluster.md): Qwen2.5-0.5B at 4K
// tokens with KVzip peaked at 2.86 GiB, against this rule's 4.2.
std::string shard_memory(const PreparedSweep& p, const ModelOptions& model, const GgufFile& file,
                         const ModelConfig& c) {
  std::error_code ec;
  double weights = 0;
  for (const GgufTensorInfo& t : file.tensors()) weights += static_cast<double>(t.n_elements());
  const double file_bytes = static_cast<double>(fs::file_size(p.run.model_path, ec));
  const double packs = model.prefill_activations == "int8" ? 1.25 * weights : 0;
  const double per_token = 2.0 * 4.0 * c.n_layers * c.n_kv_heads * c.head_dim;
  const int32_t max_new = p.config.max_new > 0 ? p.config.max_new : 256;
  const double tokens = static_cast<double>(p.config.context_tokens) +
                        static_cast<double>(p.config.turns) * (max_new + 128);
  const double bytes =
      file_bytes + 4 * weights + packs + 4 * per_token * tokens + 1024.0 * 1024 * 1024;
  return std::to_string(static_cast<int64_t>(std::ceil(bytes / (1024.0 * 1024)))) + "M";
}

// "0-3,5": the shard indices for --array.
std::string array_list(const std::vector<int>& shards) {
  std::string list;
  for (size_t i = 0; i < shards.size();) {
    size_t j = i;
    while (j + 1 < shards.size() && shards[j + 1] == shards[j] + 1) ++j;
    list += (list.empty() ? "" : ",") + std::to_string(shards[i]) +
            (j > i ? "-" + std::to_string(shards[j]) : "");
    i = j + 1;
  }
  return list;
}

std::string submit(const std::vector<std::string>& argv, const char* what) {
  const ProcessResult r = run_slurm_tool(argv);
  std::string id = r.out.substr(0, r.out.find_first_of(";\n"));
  if (r.exit_code != 0 || id.empty() || id.find_first_not_of("0123456789") != std::string::npos) {
    throw InputError(std::string("--slurm: sbatch refused the ") + what + ": " +
                     first_line(r.err.empty() ? r.out : r.err));
  }
  return id;
}

std::string this_program() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "kvbench" : exe.string();
}

// Prints each shard's state and the merge's; returns whether all is well so far (nothing
// failed, stopped or cancelled).
bool print_status(const SlurmDir& dir, const Submission& s,
                  const std::vector<ShardStatus>& statuses,
                  const std::map<std::string, std::string>& queue) {
  std::printf("slurm: %s: %d shards of %s", dir.root.c_str(), s.shards, s.config_path.c_str());
  if (!s.array_jobs.empty()) {
    std::string jobs;
    for (const std::string& j : s.array_jobs) jobs += (jobs.empty() ? "" : ", ") + j;
    std::printf(" (array jobs %s)", jobs.c_str());
  }
  std::printf("\nshard  state          units      log\n");
  for (size_t i = 0; i < statuses.size(); ++i) {
    const ShardStatus& st = statuses[i];
    const std::string units = std::to_string(st.written) + "/" + std::to_string(st.planned);
    std::printf("%-6zu %-14s %-10s %s%s\n", i, state_name(st.state), units.c_str(),
                dir.shard_log(static_cast<int>(i)).c_str(),
                st.detail.empty() ? "" : ("  (" + st.detail + ")").c_str());
  }
  std::string merge = "not submitted";
  const std::string merge_code = read_exit_file(dir.merge_exit());
  const auto q = queue.find(s.merge_job);
  if (q != queue.end()) {
    merge = q->second == "PENDING"         ? "pending (waits for the shards)"
            : queued_or_running(q->second) ? "running"
            : q->second == "COMPLETED"     ? "done"
            : q->second == "CANCELLED"     ? "cancelled (a shard did not succeed: run the same "
                                             "command again to resubmit it)"
                                           : "failed (" + q->second + ")";
  } else if (merge_code == "0") {
    merge = "done";
  } else if (!merge_code.empty()) {
    merge = "failed (exit " + merge_code + ")";
  } else if (!s.merge_job.empty()) {
    merge = "not in the queue";
  }
  if (merge == "done") {
    merge += ": " + dir.merged_db() + ", report in " + dir.report();
  }
  std::printf("merge  %s  %s\n", merge.c_str(), dir.merge_log().c_str());
  std::fflush(stdout);
  bool well = merge.rfind("failed", 0) != 0 && merge.rfind("cancelled", 0) != 0;
  for (const ShardStatus& st : statuses) {
    well = well && st.state != ShardState::Failed && st.state != ShardState::Stopped;
  }
  return well;
}

}  // namespace

void run_slurm_sweep(const ModelOptions& model_options, const std::string& config_path,
                     const SweepConfig& config, const SlurmArgs& args) {
  std::error_code ec;
  const SlurmDir dir{fs::absolute(args.dir, ec).lexically_normal().string()};
  const bool exists = fs::exists(dir.submission(), ec);
  if (args.status && !exists) {
    throw InputError("--slurm " + args.dir + ": no submission there (submission.json)");
  }
  std::optional<Submission> old;
  if (exists) old = read_submission(dir.submission());
  const int32_t shards = args.shards > 0 ? args.shards : old ? old->shards : 0;
  if (shards < 1) throw InputError("--slurm: give --shards N (the array's tasks)");

  // Everything a node will read is checked here first: the model (hashed), the calibration,
  // the corpora and task files (every sample is made, no weights loaded).
  ModelOptions model = model_options;
  PreparedSweep prepared = prepare_sweep(model, config, /*print=*/!args.status);
  model.model_path = fs::absolute(prepared.run.model_path, ec).string();
  if (model.threads <= 0)
    model.threads = static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  for (std::string& plugin : model.plugins) plugin = fs::absolute(plugin, ec).string();
  const std::unique_ptr<GgufFile> file = open_model_file(prepared.run.model_path);
  const Tokenizer tokenizer = Tokenizer::from_gguf(*file);
  const ModelConfig model_config = ModelConfig::from_gguf(*file);
  const SweepModel source{tokenizer, model_config.context_length,
                          []() -> const LlamaModel& {
                            throw InputError("--slurm: the submitting side loads no weights");
                          }};
  const std::vector<ShardPlan> plans = plan_shards(source, prepared.config, shards);

  Submission s;
  if (old) {
    s = *old;
    const std::string difference = run_config_difference(s.run_config, prepared.run.config_json);
    if (s.shards != shards || !difference.empty() || s.model_sha256 != prepared.run.model_sha256) {
      throw InputError("--slurm " + args.dir + ": holds a submission of another sweep (" +
                       (s.shards != shards
                            ? std::to_string(s.shards) + " shards, not " + std::to_string(shards)
                        : !difference.empty() ? difference
                                              : std::string("model")) +
                       "); use another folder");
    }
  } else {
    s.config_path = fs::absolute(config_path, ec).string();
    s.shards = shards;
    s.run_config = prepared.run.config_json;
    s.model_sha256 = prepared.run.model_sha256;
  }

  const std::map<std::string, std::string> queue = queue_states(s);
  std::vector<ShardStatus> statuses;
  for (int i = 0; i < shards; ++i) statuses.push_back(shard_status(i, plans[i], dir, s, queue));
  if (args.status) {
    if (!print_status(dir, s, statuses, queue)) throw CheckFailed{};
    return;
  }

  std::vector<int> to_submit;
  std::vector<std::string> still_queued;  // array tasks the merge must wait for too
  for (int i = 0; i < shards; ++i) {
    const ShardStatus& st = statuses[i];
    if (st.state == ShardState::Pending || st.state == ShardState::Running) {
      still_queued.push_back(st.task);
    } else if (st.state != ShardState::Done) {
      to_submit.push_back(i);
    }
  }
  const auto merge_state = queue.find(s.merge_job);
  const bool merge_queued = merge_state != queue.end() && queued_or_running(merge_state->second);
  const bool merged = read_exit_file(dir.merge_exit()) == "0" && fs::exists(dir.merged_db(), ec);
  if (to_submit.empty() && (merge_queued || (still_queued.empty() && merged))) {
    std::printf("slurm: nothing to submit: %s\n",
                merge_queued ? "the shards not done are queued or running, and the merge waits"
                             : "every shard is done and merged");
    print_status(dir, s, statuses, queue);
    return;
  }

  fs::create_directories(dir.root + "/logs", ec);
  fs::create_directories(dir.root + "/status", ec);
  if (ec) throw InputError("--slurm " + args.dir + ": cannot create it: " + ec.message());
  const std::string program = this_program();
  const std::string cwd = fs::current_path(ec).string();

  // The shard's script: its task's index is the shard; the exit status kept beside the db.
  const std::vector<std::string> command =
      shard_command(program, model, s.config_path, "@DB@", "@SHARD@");
  std::string line = shell_line(command);
  line.replace(line.find("'@DB@'"), 6, "\"$db\"");
  line.replace(line.find("'@SHARD@'"), 9, "\"$i/" + std::to_string(shards) + "\"");
  const std::string root = shell_quote(dir.root);
  const std::string shard_script =
      "#!/bin/bash\n"
      "# Written by kvbench sweep --slurm (again at every submission): shard $SLURM_ARRAY_TASK_ID\n"
      "# of the sweep into its own db, which a rerun resumes.\n"
      "i=\"$SLURM_ARRAY_TASK_ID\"\n"
      "db=" +
      root +
      "\"/shard-$i.db\"\n"
      "rm -f " +
      root +
      "\"/status/shard-$i.exit\"\n"
      "echo \"kvbench: shard $i/" +
      std::to_string(shards) +
      ", task ${SLURM_ARRAY_JOB_ID}_$i on $(hostname) at $(date -u +%FT%TZ)\"\n"
      "rc=0\n" +
      line +
      " || rc=$?\n"
      "echo \"$rc\" > " +
      root +
      "\"/status/shard-$i.exit\"\n"
      "exit \"$rc\"\n";
  std::vector<std::string> dbs;
  for (int i = 0; i < shards; ++i) dbs.push_back(dir.shard_db(i));
  std::vector<std::string> merge_command = {program, "merge"};
  merge_command.insert(merge_command.end(), dbs.begin(), dbs.end());
  merge_command.insert(merge_command.end(), {"-o", dir.merged_db()});
  const std::string merged_files = shell_quote(dir.merged_db()) + " " +
                                   shell_quote(dir.merged_db() + "-wal") + " " +
                                   shell_quote(dir.merged_db() + "-shm");
  const std::string merge_script =
      "#!/bin/bash\n"
      "# Written by kvbench sweep --slurm: the shards' dbs merged, the leaderboard written.\n"
      "set -euo pipefail\n"
      "rm -f " +
      shell_quote(dir.merge_exit()) + " " + merged_files + "\n" + shell_line(merge_command) + "\n" +
      shell_line({program, "report", dir.merged_db(), "-o", dir.report()}) +
      "\n"
      "echo 0 > " +
      shell_quote(dir.merge_exit()) + "\n";
  write_files_atomically({{dir.shard_script(), shard_script}, {dir.merge_script(), merge_script}},
                         "Slurm script");

  std::string time_why = "--time";
  const std::string time =
      args.time.empty() ? shard_time_limit(plans, prepared, &time_why) : args.time;
  const std::string mem = args.mem.empty() ? shard_memory(prepared, model, *file, model_config)
                                             : args.mem;
  if (!to_submit.empty()) {
    std::vector<std::string> sbatch = {"sbatch",
                                       "--parsable",
                                       "--job-name=kvbench-sweep",
                                       "--array=" + array_list(to_submit),
                                       "--cpus-per-task=" + std::to_string(model.threads),
                                       "--mem=" + mem,
                                       "--time=" + time,
                                       "--chdir=" + cwd,
                                       "--output=" + dir.root + "/logs/shard-%a.log",
                                       "--open-mode=append"};
    sbatch.insert(sbatch.end(), args.sbatch_options.begin(), args.sbatch_options.end());
    sbatch.push_back(dir.shard_script());
    const std::string job = submit(sbatch, "shards' array");
    s.array_jobs.push_back(job);
    write_submission(dir.submission(), s);
    std::printf("slurm: shards %s of %d submitted as array job %s (%d cpu%s, %s, time %s: %s)\n",
                array_list(to_submit).c_str(), shards, job.c_str(), model.threads,
                model.threads == 1 ? "" : "s", mem.c_str(), time.c_str(), time_why.c_str());
    for (int i : to_submit) still_queued.push_back(job + "_" + std::to_string(i));
  }
  // The old merge job waits for tasks that will never succeed: replaced.
  if (merge_queued) run_slurm_tool({"scancel", s.merge_job});
  std::vector<std::string> merge_sbatch = {"sbatch",
                                           "--parsable",
                                           "--job-name=kvbench-merge",
                                           "--cpus-per-task=1",
                                           "--mem=" + mem,
                                           "--time=01:00:00",
                                           "--chdir=" + cwd,
                                           "--output=" + dir.merge_log(),
                                           "--open-mode=append",
                                           "--kill-on-invalid-dep=yes"};
  if (!still_queued.empty()) {
    std::string dependency = "--dependency=afterok";
    for (const std::string& task : still_queued) dependency += ":" + task;
    merge_sbatch.push_back(dependency);
  }
  for (const std::string& option : args.sbatch_options) {
    // GPUs are for the shards; the merge reads dbs.
    if (option.rfind("--gres", 0) != 0 && option.rfind("--gpus", 0) != 0)
      merge_sbatch.push_back(option);
  }
  merge_sbatch.push_back(dir.merge_script());
  s.merge_job = submit(merge_sbatch, "merge job");
  write_submission(dir.submission(), s);
  std::printf("slurm: merge and report as job %s, after the shards succeed: %s, %s\n",
              s.merge_job.c_str(), dir.merged_db().c_str(), dir.report().c_str());
  std::printf("slurm: status: kvbench sweep %s --slurm %s --status\n", config_path.c_str(),
              args.dir.c_str());
  std::fflush(stdout);
}

}  // namespace kvbench
