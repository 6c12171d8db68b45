#include "harness/sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "cache/registry.h"
#include "common/input_error.h"
#include "common/json_input.h"
#include "common/sha256.h"
#include "datasets/generator.h"
#include "harness/calibration.h"
#include "harness/model/llama_model.h"
#include "harness/model/model_config.h"
#include "harness/model/tokenizer.h"
#include "harness/model_cache.h"
#include "harness/plugin_guard.h"
#include "harness/shared_prefill.h"
#include "store/results_db.h"
#include "tasks/task_catalog.h"

namespace kvbench {

namespace {

// One sample of the sweep in one mode, query setting and turn gap: its methods are the
// group's units.
struct Group {
  const SweepTask* task = nullptr;
  uint64_t seed = 0;
  const Sample* sample = nullptr;
  std::string mode;
  std::string query_setting = "agnostic";
  double turn_gap_s = 0;
};

// A turn gap as the key writes it: the shortest text that reads back the same.
std::string gap_text(double seconds) {
  char buf[32];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, seconds);
    if (std::strtod(buf, nullptr) == seconds) break;
  }
  return buf;
}

// The agnostic, gap-0 key is the one from before either existed, so a resumed sweep skips
// what an older kvbench finished; the others add "|aware" and "|gap=<s>".
std::string unit_key(const Group& group, const std::string& method) {
  std::string key = group.task->label() + "|" + group.sample->id + "|" + group.mode + "|" + method;
  if (group.query_setting != "agnostic") key += "|" + group.query_setting;
  if (group.turn_gap_s != 0) key += "|gap=" + gap_text(group.turn_gap_s);
  return key;
}

// Every sample of every (task, seed), generated or loaded up front: cheap next to a run,
// and every bad input fails before anything is written.
struct TaskSamples {
  const SweepTask* task;
  uint64_t seed;
  std::vector<Sample> samples;
};

std::vector<TaskSamples> load_task_samples(const SweepModel& source, const SweepConfig& config) {
  const int64_t window = source.context_length;
  std::vector<TaskSamples> all;
  for (const SweepTask& task : config.tasks) {
    const TaskFormat& format = task_format(task.name);
    if (format.source == TaskSource::Scbench) {
      std::vector<Sample> raw = load_samples_jsonl(task.data);
      if (static_cast<size_t>(config.samples) < raw.size()) raw.resize(config.samples);
      TaskSamples ts{&task, 0, {}};
      for (const Sample& s : raw) ts.samples.push_back(format_scbench_sample(task.name, s));
      all.push_back(std::move(ts));
      continue;
    }
    if (config.context_tokens >= window) {
      throw InputError("context_tokens " + std::to_string(config.context_tokens) +
                       " is not shorter than the model's context window of " +
                       std::to_string(window) + " tokens");
    }
    for (uint64_t seed : config.seeds) {
      GeneratorOptions g;
      g.task = task.name;
      g.context_tokens = config.context_tokens;
      g.turns = config.turns;
      g.samples = config.samples;
      g.seed = seed;
      g.knobs = task.knobs;
      all.push_back({&task, seed, generate_samples(g, source.tokenizer)});
    }
  }
  return all;
}

// The sweep's groups in a fixed order: group g belongs to shard g % count.
std::vector<Group> make_groups(const SweepConfig& config, const std::vector<TaskSamples>& all) {
  std::vector<Group> groups;
  for (const TaskSamples& ts : all) {
    for (const Sample& sample : ts.samples) {
      for (const std::string& mode : config.modes) {
        // A multi-turn conversation keeps its cache in the session: no gap applies to it.
        const std::vector<double> gaps =
            mode == "multi-request" ? config.turn_gaps_s : std::vector<double>{0};
        for (const std::string& query : config.query_settings) {
          for (double gap : gaps) groups.push_back({ts.task, ts.seed, &sample, mode, query, gap});
        }
      }
    }
  }
  return groups;
}

bool in_shard(size_t group, const Shard& shard) {
  return static_cast<int32_t>(group % static_cast<size_t>(shard.count)) == shard.index;
}

// Adds the units of `methods` in group's task to a plan's per-task counts, and those of them
// that will prefill their context themselves (the time estimate charges each a prefill).
void add_planned(std::vector<PlannedUnits>& planned, const SweepConfig& config, const Group& group,
                 const std::vector<SweepMethod>& methods) {
  const std::string label = group.task->label();
  auto p = std::find_if(planned.begin(), planned.end(),
                        [&](const PlannedUnits& u) { return u.task == label; });
  if (p == planned.end()) {
    planned.push_back({label, config.context_tokens, config.turns, 0, 0, 0});
    p = planned.end() - 1;
  }
  p->units += static_cast<int64_t>(methods.size());
  p->groups += 1;
  for (const SweepMethod& m : methods) {
    if (!config.shared_prefill || !SharedPrefill::may_share(m.spec)) ++p->own_prefills;
  }
}

// CacheStats::tokens_per_head ([n_layers * n_kv_heads], by layer) as one row per layer.
std::vector<std::vector<int64_t>> head_tokens_by_layer(const CacheStats& stats) {
  std::vector<std::vector<int64_t>> out;
  const size_t layers = stats.tokens_per_layer.size();
  if (layers == 0 || stats.tokens_per_head.size() % layers != 0) return out;
  const size_t heads = stats.tokens_per_head.size() / layers;
  if (heads == 0) return out;
  for (size_t l = 0; l < layers; ++l) {
    const auto first = stats.tokens_per_head.begin() + static_cast<std::ptrdiff_t>(l * heads);
    out.emplace_back(first, first + static_cast<std::ptrdiff_t>(heads));
  }
  return out;
}

TurnRow turn_row(const TurnRecord& t, bool fidelity, std::optional<double> score) {
  TurnRow row;
  row.turn = t.turn;
  row.query = t.query;
  row.prediction = t.prediction;
  row.reference = t.reference;
  row.stop_reason = t.stop_reason;
  row.prompt_tokens = t.prompt_tokens;
  row.output_tokens = t.output_tokens;
  row.appended_tokens = t.appended_tokens;
  row.ttft_ms = t.ttft_ms;
  row.tpot_ms = t.tpot_ms;
  row.prefill_tokens_per_s = t.prefill_tokens_per_s;
  row.decode_tokens_per_s = t.decode_tokens_per_s;
  row.kv_bytes = t.kv_bytes;
  row.kv_bytes_peak = t.kv_bytes_peak;
  row.kv_read_per_step = t.kv_read_per_step;
  row.retrieval_recall = t.retrieval_recall;
  row.attn_flops = t.attn_flops;
  row.attn_flops_dense = t.attn_flops_dense;
  row.tokens_kept = t.tokens_kept;
  row.tokens_seen = t.cache.tokens_seen;
  row.tokens_evicted = t.cache.tokens_evicted;
  row.hits = t.cache.hits;
  row.misses = t.cache.misses;
  row.bytes_moved = t.cache.bytes_moved;
  row.tokens_reused = t.reuse.tokens_reused;
  row.reuse_bytes_loaded = t.reuse.bytes_loaded;
  row.reuse_load_ms = t.reuse.load_ms;
  row.reuse_faults = t.reuse.faults;
  for (const TierStats& tier : t.reuse_tiers) {
    char load_ms[32];
    std::snprintf(load_ms, sizeof load_ms, "%.1f", tier.load_ms);
    row.reuse_tiers += (row.reuse_tiers.empty() ? "" : ";") + tier.name + ":" +
                       std::to_string(tier.hits) + "/" + std::to_string(tier.misses) + "/" +
                       std::to_string(tier.bytes_in / 1024) + "/" +
                       std::to_string(tier.bytes_out / 1024) + "/" + std::to_string(tier.faults) +
                       "/" + std::to_string(tier.bytes_resident / 1024) + "/" + load_ms;
  }
  if (fidelity) {
    row.first_token_kl = t.first_token_kl;
    row.top1_agreement = t.top1_agreement;
  }
  row.score = score;
  return row;
}

}  // namespace


namespace {

std::string percent(double x) {
  char text[16];
  std::snprintf(text, sizeof text, "%.0f%%", 100 * x);
  return text;
}

}  // namespace

void apply_calibration(SweepConfig& config, const Calibration& calibration,
                       const std::string& model_sha256, const std::string& calibration_file) {
  if (config.min_full_accuracy <= 0) return;
  if (calibration.model_sha256 != model_sha256) {
    throw InputError(calibration_file + ": calibrated on another file of " + calibration.model +
                     " (sha256 " + calibration.model_sha256.substr(0, 12) + ", this one " +
                     model_sha256.substr(0, 12) + "); rerun kvbench calibrate");
  }
  std::vector<SweepTask> kept;
  for (SweepTask& task : config.tasks) {
    if (!task.data.empty()) {  // an SCBench file is the user's choice, not a generated setting
      kept.push_back(std::move(task));
      continue;
    }
    const CalibrationCell* cell = calibration.find(task.label(), config.context_tokens);
    const std::string at = " at " + std::to_string(config.context_tokens) + " tokens";
    if (!cell) {
      config.excluded_tasks.push_back(
          {task.label(), "not calibrated" + at + " (kvbench calibrate --task " + task.label() +
                             " --lengths " + std::to_string(config.context_tokens) + ")"});
    } else if (!cell->has_control()) {
      config.excluded_tasks.push_back(
          {task.label(), "calibrated" + at + " before the no-context control (rerun kvbench "
                             "calibrate --task " + task.label() + " --lengths " +
                             std::to_string(config.context_tokens) + ")"});
    } else if (cell->accuracy < config.min_full_accuracy) {
      config.excluded_tasks.push_back(
          {task.label(), "full cache " + percent(cell->accuracy) + " (95% interval " +
                             percent(cell->low) + "-" + percent(cell->high) + ", " +
                             std::to_string(cell->samples * cell->turns) + " turns)" + at +
                             " in calibration, below " + percent(config.min_full_accuracy)});
    } else if (cell->no_context_accuracy > config.max_no_context_accuracy) {
      config.excluded_tasks.push_back(
          {task.label(), "answered " + percent(cell->no_context_accuracy) +
                             " without the context" + at + " in calibration, above " +
                             percent(config.max_no_context_accuracy) +
                             ": the answers do not need the context"});
    } else {
      config.calibrated_tasks.push_back(
          {task.label(), cell->accuracy, cell->no_context_accuracy});
      kept.push_back(std::move(task));
    }
  }
  if (kept.empty()) {
    throw InputError(calibration_file + ": no task of the sweep at " +
                     std::to_string(config.context_tokens) + " tokens scores " +
                     percent(config.min_full_accuracy) + " or more with the full cache and " +
                     percent(config.max_no_context_accuracy) +
                     " or less without the context; nothing to run");
  }
  config.tasks = std::move(kept);
}

SweepProgress run_sweep(const LlamaModel& model, const SweepConfig& config, const Shard& shard,
                        ResultsDb& db, RunRecord run,
                        const std::function<void(const SweepProgress&)>& progress,
                        const UnitSink& on_unit) {
  run.config_json = run_config_json(config, model.dtype(),
                                    {model.decode_activations(), model.prefill_activations()});
  const SweepModel source{model.tokenizer(), model.config().context_length,
                          [&model]() -> const LlamaModel& { return model; }};
  return run_sweep(source, config, shard, db, run, progress, on_unit);
}

SweepProgress run_sweep(const SweepModel& source, const SweepConfig& config, const Shard& shard,
                        ResultsDb& db, const RunRecord& run,
                        const std::function<void(const SweepProgress&)>& progress,
                        const UnitSink& on_unit) {
  const std::vector<SweepMethod> methods = sweep_methods(config);
  const std::vector<TaskSamples> all = load_task_samples(source, config);
  const std::vector<Group> groups = make_groups(config, all);
  const std::set<std::string> finished = db.finished_unit_keys();
  SweepProgress state;
  std::vector<std::pair<const Group*, std::vector<SweepMethod>>> todo;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!in_shard(g, shard)) continue;
    const Group& group = groups[g];
    std::vector<SweepMethod> left;
    for (const SweepMethod& m : methods) {
      if (finished.count(unit_key(group, m.spec.canonical))) {
        ++state.skipped;
      } else {
        left.push_back(m);
      }
    }
    if (!left.empty()) {
      state.total += static_cast<int64_t>(left.size());
      add_planned(state.planned, config, group, left);
      todo.emplace_back(&group, std::move(left));
    }
  }
  if (progress) progress(state);  // the plan, before anything runs
  // The options of a group: an SCBench file's samples are cut to `turns` too.
  auto options_of = [&](const Group& group) {
    EvaluationOptions options;
    options.session.mode = parse_session_mode(group.mode);
    options.session.max_new_tokens = config.max_new;
    options.session.query = parse_query_setting(group.query_setting);
    options.session.turn_gap_s = group.turn_gap_s;
    if (task_format(group.task->name).source == TaskSource::Scbench) {
      options.session.max_turns = config.turns;
    }
    options.fidelity = config.fidelity;
    options.shared_prefill = config.shared_prefill;
    return options;
  };
  if (todo.empty()) {  // a run with no units, and no model loaded for it
    db.finish_run(db.begin_run(run));
    return state;
  }
  const LlamaModel& model = source.load();
  for (const auto& [group, left] : todo) check_samples_fit(model, {*group->sample}, options_of(*group));

  // Not in the first unit's TTFT, nor in the first shared prefill (so in every method's).
  warm_up(model);
  const int64_t run_id = db.begin_run(run);
  const auto start = std::chrono::steady_clock::now();
  auto last_written = start;  // a unit's wall time runs from the previous unit's write
  for (const auto& todo_entry : todo) {
    // Named, not a structured binding: C++17 lambdas (clang's) cannot capture those.
    const auto& group = todo_entry.first;
    const auto& left = todo_entry.second;
    const EvaluationOptions options = options_of(*group);
    std::vector<ResolvedSpec> specs;
    std::map<std::string, std::string> budget_of_spec;
    for (const SweepMethod& m : left) {
      specs.push_back(m.spec);
      budget_of_spec[m.spec.canonical] = m.budget;
    }
    // A plugin's code runs inside these units: what it throws (or an exit() in it) is
    // reported naming it, the units it broke left unwritten.
    const PluginGuard guard(specs);
    PrefillCount prefilled;
    try {
      prefilled = evaluate(model, {*group->sample}, specs, options, [&](const UnitResult& unit) {
      const SessionResult& s = unit.session;
      UnitRecord record;
      record.key = unit_key(*group, s.method);
      record.task = group->task->label();
      record.sample_id = group->sample->id;
      record.method = s.method;
      record.budget = budget_of_spec[s.method];
      record.mode = group->mode;
      record.query_setting = group->query_setting;
      record.turn_gap_s = group->turn_gap_s;
      record.seed = group->seed;
      record.context_tokens = s.context_tokens;
      record.context_prefill_ms = s.context_prefill_ms;
      record.prefill = s.prefill;
      record.shared_prefill = s.shared_prefill;
      record.prefilled_tokens = s.prefilled_tokens;
      const auto now = std::chrono::steady_clock::now();
      record.wall_ms = std::chrono::duration<double, std::milli>(now - last_written).count();
      last_written = now;
      record.shared_forward_ms = unit.shared_forward_ms;
      record.reference_ms = unit.reference_ms;
      if (!s.turns.empty()) {  // the report's heat map: the cache as the first turn left it
        record.head_tokens = head_tokens_by_layer(s.turns[0].cache);
        record.head_tokens_seen = s.turns[0].cache.tokens_seen;
      }
      for (size_t i = 0; i < s.turns.size(); ++i) {
        std::optional<double> score;
        if (!unit.scores.empty()) score = unit.scores[i];
        record.turns.push_back(turn_row(s.turns[i], s.fidelity, score));
      }
      db.write_unit(run_id, record);
      ++state.done;
      state.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      state.last_unit = record.key;
      if (on_unit) on_unit(unit);
      if (progress) progress(state);
      });
    } catch (const InputError&) {
      throw;
    } catch (const std::exception& e) {
      guard.fail(e.what());
    } catch (...) {
      guard.fail("it threw something that is not a std::exception");
    }
    // The sample's shared prefill, its full reference and every unit's own prefills.
    state.prefill.shared_prefills += prefilled.shared_prefills;
    state.prefill.shared_tokens += prefilled.shared_tokens;
    state.prefill.unit_tokens += prefilled.unit_tokens;
  }
  db.finish_run(run_id);
  return state;
}

std::vector<ShardPlan> plan_shards(const SweepModel& source, const SweepConfig& config,
                                   int32_t count) {
  const std::vector<SweepMethod> methods = sweep_methods(config);
  const std::vector<TaskSamples> all = load_task_samples(source, config);
  const std::vector<Group> groups = make_groups(config, all);
  std::vector<ShardPlan> plans(static_cast<size_t>(count));
  for (size_t g = 0; g < groups.size(); ++g) {
    ShardPlan& plan = plans[g % static_cast<size_t>(count)];
    for (const SweepMethod& m : methods) {
      plan.unit_keys.push_back(unit_key(groups[g], m.spec.canonical));
    }
    add_planned(plan.planned, config, groups[g], methods);
  }
  return plans;
}

std::string run_config_json(const SweepConfig& config, ModelDtype dtype,
                            CpuActivations activations) {
  const std::string canonical = canonical_config_json(config);
  // The plugins the sweep's methods come from, by sha256 (the file name kept for the report;
  // a resume or merge compares the bytes alone, store/run_identity.h): a rebuilt plugin is
  // another method, so a db of the old one refuses to resume with it.
  std::map<std::string, std::string> plugins;  // sha256 -> file
  for (const SweepMethod& m : sweep_methods(config)) {
    for (const auto& [info, params] : m.spec.components) {
      if (!info->plugin.empty()) plugins[info->plugin_sha256] = info->plugin;
    }
  }
  // The SCBench files the tasks read, by their bytes: other contexts or answers under the same
  // name are another sweep, which a resume or a merge must not mix in.
  std::map<std::string, std::string> data;  // file -> sha256
  for (const SweepTask& task : config.tasks) {
    if (!task.data.empty()) data[task.data] = sha256_file(task.data);
  }
  const bool default_numerics = dtype == ModelDtype::Fp32 &&
                                activations.decode == Activations::Fp32 &&
                                activations.prefill == Activations::Fp32;
  if (default_numerics && plugins.empty() && data.empty()) {
    return canonical;  // as before numerics, plugins and data were recorded: older dbs resume
  }
  nlohmann::json root = nlohmann::json::parse(canonical);
  if (!default_numerics) {
    root["numerics"] = {{"dtype", dtype_name(dtype)},
                        {"decode_activations", activations_name(activations.decode)}};
    // Only when set: runs from before the int8 prefill GEMM keep their identity.
    if (activations.prefill != Activations::Fp32) {
      root["numerics"]["prefill_activations"] = activations_name(activations.prefill);
    }
  }
  for (const auto& [sha256, file] : plugins) {
    root["plugins"].push_back({{"file", file}, {"sha256", sha256}});
  }
  for (const auto& [file, sha256] : data) {
    root["data_files"].push_back({{"file", file}, {"sha256", sha256}});
  }
  return dump_json(root);
}

}  // namespace kvbench