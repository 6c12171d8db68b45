// Plugins (cache/plugin_api.h, harness/plugins.h): every bad plugin is one line and exit 2 with
// no rows written; the example plugin's Knorm (examples/plugin_method) equals the built-in one
// bit for bit; a plugin method composes, lists, sweeps, resumes and reports like a built-in one.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cache/full_cache.h"
#include "cache/plugin_api.h"
#include "cache/registry.h"
#include "cache_feed.h"
#include "cli_run.h"
#include "common/input_error.h"
#include "common/sha256.h"
#include "gguf_writer.h"
#include "harness/generate.h"
#include "harness/model/llama_model.h"
#include "harness/model/tokenizer.h"
#include "harness/plugins.h"
#include "kept_positions.h"

using namespace kvbench;
using testing::require_clear_error;
using testing::file_text;
using testing::path_exists;
using testing::Run;
using testing::run_kvbench;
using testing::sql_text;
using testing::temp_path;
using testing::write_text;

namespace {

const std::string kExample = KVBENCH_EXAMPLE_PLUGIN;

std::string test_plugin(const std::string& name) {
  return std::string(KVBENCH_TEST_PLUGIN_DIR) + "/libtest_plugin_" + name + ".so";
}

// A tiny model with four layers (Knorm's skip leaves the first ones whole) and room for a
// sweep's contexts.
std::string tiny_model(const std::string& name) {
  testing::TinyLlamaSpec spec;
  spec.n_layer = 4;
  spec.context_length = 2048;
  const std::string path = temp_path(name);
  testing::write_tiny_llama_gguf(path, spec);
  return path;
}

std::string sweep_config(const std::string& name, const std::string& extra) {
  return write_text(name, R"({"tasks": ["math_find"], "methods": ["full", "knorm:skip=1",
    "example_knorm:skip=1"], "budgets": [48], "samples": 1, "turns": 2, "context_tokens": 300,
    "max_new": 3)" + extra + "}");
}

}  // namespace

TEST_CASE("plugins: every bad plugin is one line naming it, exit 2, and no db", "[unit]") {
  const std::string model = tiny_model("plugin_bad.gguf");
  const std::string config = sweep_config("plugin_bad.json", "");
  const std::string not_so = write_text("not_a_plugin.so", "just text\n");
  const struct {
    std::string plugin, why;
  } cases[] = {
      {temp_path("no_such_plugin.so"), "no such file"},
      {not_so, "not a loadable shared object"},
      {test_plugin("no_entry"), "no entry point kvbench_plugin_register"},
      {test_plugin("bad_version"),
       "built for plugin interface version " + std::to_string(KVBENCH_PLUGIN_INTERFACE_VERSION + 1) +
           ", this kvbench has version " + std::to_string(KVBENCH_PLUGIN_INTERFACE_VERSION) +
           "; rebuild it"},
      {test_plugin("clash"), "method 'knorm' is already registered (built into kvbench)"},
      {test_plugin("throws"), "registration failed: out of coffee"},
  };
  for (const auto& c : cases) {
    INFO(c.plugin);
    const std::string db = temp_path("plugin_bad.db");
    std::remove(db.c_str());
    require_clear_error(run_kvbench("--plugin " + c.plugin + " --model " + model +
                                    " --threads 1 sweep " + config + " --db " + db),
                        "plugin " + c.plugin + ": " + c.why);
    CHECK_FALSE(path_exists(db));
    // Named by a sweep config, relative to it, the line names the config too.
    const std::string in_config =
        sweep_config("plugin_bad_in_config.json", ", \"plugins\": [\"" + c.plugin + "\"]");
    require_clear_error(run_kvbench("--model " + model + " --threads 1 sweep " + in_config +
                                    " --db " + db),
                        in_config + ": plugin " + c.plugin + ": " + c.why);
    CHECK_FALSE(path_exists(db));
  }
}

TEST_CASE("plugins: a plugin that throws registers nothing, and can be told apart", "[unit]") {
  CHECK_THROWS_AS(load_plugin(test_plugin("throws")), InputError);
  CHECK(find_method("registered_before_the_throw") == nullptr);
  CHECK_THROWS_AS(load_plugin(test_plugin("clash")), InputError);
  CHECK(find_method("knorm")->plugin.empty());  // still the built-in one
}

TEST_CASE("plugins: the example's Knorm keeps, scores and holds what the built-in one does",
          "[unit]") {
  load_plugin(kExample);
  load_plugin(kExample);  // the same bytes again: nothing more
  const MethodInfo* info = find_method("example_knorm");
  REQUIRE(info != nullptr);
  CHECK(info->plugin == "libexample_methods.so");
  CHECK(info->plugin_sha256 == sha256_file(kExample));
  REQUIRE(loaded_plugins().size() == 1);
  CHECK(loaded_plugins()[0].methods ==
        std::vector<std::string>{"example_knorm", "value_attention", "vatp_h2o"});

  testing::TinyLlamaSpec spec;
  spec.n_layer = 4;
  spec.context_length = 512;
  const std::string path = temp_path("plugin_knorm.gguf");
  testing::write_tiny_llama_gguf(path, spec);
  auto model = LlamaModel::load(path);
  const std::vector<int32_t> prompt = model->tokenizer().encode(
      "the quick brown fox jumps over the lazy dog, and then the dog sleeps while the fox "
      "runs far away into the green hills beyond the river");
  REQUIRE(prompt.size() > 40);
  for (const std::string params : {"budget=24,skip=1", "ratio=0.5,skip=0", "budget=17,skip=3"}) {
    INFO(params);
    KvCache builtin = make_cache("knorm:" + params, model->kv_shape());
    KvCache plugin = make_cache("example_knorm:" + params, model->kv_shape());
    GenerateOptions options;
    options.max_new_tokens = 6;
    const GenerateResult a = generate(*model, builtin, prompt, options);
    const GenerateResult b = generate(*model, plugin, prompt, options);
    CHECK(a.tokens == b.tokens);
    CHECK(a.cache.bytes_resident == b.cache.bytes_resident);
    CHECK(a.cache.bytes_peak == b.cache.bytes_peak);
    CHECK(a.cache.tokens_per_layer == b.cache.tokens_per_layer);
    CHECK(a.cache.tokens_evicted > 0);
    CHECK(a.cache.tokens_evicted == b.cache.tokens_evicted);
    CHECK(a.cache.bytes_per_layer == b.cache.bytes_per_layer);
    for (int32_t l = 0; l < spec.n_layer; ++l) {
      for (int32_t h = 0; h < spec.n_head_kv; ++h) {
        CHECK(testing::kept(builtin, l, h) == testing::kept(plugin, l, h));
      }
    }
    // The next token's logits, bit for bit.
    const std::vector<float> la = model->forward({prompt[3]}, builtin);
    const std::vector<float> lb = model->forward({prompt[3]}, plugin);
    CHECK(la == lb);
  }
}

TEST_CASE("plugins: a scorer method composes, keeps its window and sink, and lists", "[unit]") {
  load_plugin(kExample);
  const KvShape shape{3, 2, 32};
  const int32_t n_heads = 4;
  std::mt19937 rng(7);
  const testing::Chunk context = testing::random_chunk(64, shape, n_heads, rng);
  // The budget is checked as a built-in method's: budget and ratio together are refused
  // (the ratio won silently before), as is a window larger than the budget.
  for (const char* bad : {"value_attention:budget=24,ratio=0.5", "value_attention:budget=4,window=8"}) {
    INFO(bad);
    CHECK_THROWS_AS(kvbench::resolve_method_spec(bad), kvbench::InputError);
  }
  // value_attention: the last 8 (the window) and the first 4 (sink) in every head.
  KvCache cache = make_cache("value_attention:budget=24,window=8,sink=4", shape);
  testing::feed(cache, n_heads, context);
  cache.end_context();
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
      const std::vector<int32_t> kept = testing::kept(cache, l, h);
      REQUIRE(kept.size() == 24);
      for (int32_t p : {0, 1, 2, 3, 56, 57, 58, 59, 60, 61, 62, 63}) {
        CHECK(std::count(kept.begin(), kept.end(), p) == 1);
      }
    }
  }
  // With an allocation in front the heads keep their own counts, the layer's total the same;
  // with a storage method behind, its store holds what is kept.
  KvCache ada = make_cache("adakv+example_knorm:ratio=0.5,skip=0", shape);
  testing::feed(ada, n_heads, context);
  ada.end_context();
  bool uneven = false;
  for (int32_t l = 0; l < shape.n_layers; ++l) {
    const size_t a = testing::kept(ada, l, 0).size(), b = testing::kept(ada, l, 1).size();
    CHECK(a + b <= 64);  // AdaKV's rounding may leave one short of the layer's 2 x 32
    CHECK(a + b >= 63);
    uneven = uneven || a != b;
  }
  CHECK(uneven);
  KvCache packed = make_cache("example_knorm:budget=32,skip=0+kivi:bits=2", shape);
  testing::feed(packed, n_heads, context);
  packed.end_context();
  CHECK(packed.layer(0).n_tokens() == 32);

  const Run list = run_kvbench("--plugin " + kExample + " list methods");
  INFO(list.output);
  CHECK(list.exit_code == 0);
  CHECK(list.output.find("example_knorm\n") != std::string::npos);
  CHECK(list.output.find("plugin: libexample_methods.so (sha256 " + sha256_file(kExample)) !=
        std::string::npos);
  CHECK(list.output.find("value_attention\n") != std::string::npos);
}

namespace {

// Original positions KV head `head` of `layer` holds, ascending, from the view a policy that
// reads layers of ragged heads is shown (any store: a split KIVI layer shows no rectangle).
std::vector<int32_t> held_positions(const KvCache& cache, int32_t layer, int32_t head) {
  const DenseKv kv = cache.layer(layer).heads_view();
  std::vector<int32_t> positions;
  for (int64_t t = 0; t < kv.tokens(head); ++t) positions.push_back(kv.position(head, t));
  std::sort(positions.begin(), positions.end());
  return positions;
}

}  // namespace

TEST_CASE("plugins: the example's full policy evicts at every step, alone and under adakv+",
          "[unit]") {
  load_plugin(kExample);
  const KvShape shape{3, 2, 32};
  const int32_t n_heads = 4;
  std::mt19937 rng(11);
  const testing::Chunk context = testing::random_chunk(64, shape, n_heads, rng);
  for (const std::string spec : {"vatp_h2o:budget=24", "adakv+vatp_h2o:budget=24",
                                 "adakv+vatp_h2o:budget=24+kivi:bits=4"}) {
    INFO(spec);
    const bool allocated = spec.rfind("adakv", 0) == 0;
    KvCache cache = make_cache(spec, shape);
    testing::feed(cache, n_heads, context);
    cache.end_context();
    // Each head's count at the end of the context: the budget, or the allocation's split.
    std::vector<std::vector<int64_t>> counts(shape.n_layers);
    bool uneven = false;
    for (int32_t l = 0; l < shape.n_layers; ++l) {
      for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
        counts[l].push_back(cache.layer(l).head_tokens(h));
        CHECK(static_cast<int64_t>(held_positions(cache, l, h).size()) == counts[l][h]);
      }
      // AdaKV's floor is the integer part of 0.2 x 24 a head (4, not 4.8): 46.4 of 48.
      const int64_t total = counts[l][0] + counts[l][1];
      CHECK(total <= 48);
      CHECK(total >= (allocated ? 46 : 48));
      if (!allocated) CHECK(counts[l][0] == 24);
      uneven = uneven || counts[l][0] != counts[l][1];
    }
    CHECK(uneven == allocated);
    // Every decode step adds a token and the policy drops one per head: each keeps its count
    // and its newest token.
    for (int32_t step = 0; step < 5; ++step) {
      testing::decode_step(cache, n_heads, testing::random_chunk(1, shape, n_heads, rng));
      for (int32_t l = 0; l < shape.n_layers; ++l) {
        for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
          const std::vector<int32_t> held = held_positions(cache, l, h);
          CHECK(static_cast<int64_t>(held.size()) == counts[l][h]);
          CHECK(cache.layer(l).head_tokens(h) == counts[l][h]);
          CHECK(held.back() == 64 + step);
        }
      }
    }
    CHECK(cache.stats().tokens_evicted > 0);
  }

  // What such a policy is shown of a layer whose heads hold their own counts: the heads
  // gathered, each head's count in head_tokens, its rows past it padding no query attends,
  // read through the checked accessors; every other policy sees the shape alone.
  KvCache ada = make_cache("adakv+vatp_h2o:budget=24", shape);
  testing::feed(ada, n_heads, context);
  ada.end_context();
  const auto& dense = dynamic_cast<const DenseLayerKv&>(ada.layer(0));
  REQUIRE(dense.ragged());
  CHECK(dense.view().k == nullptr);
  const DenseKv view = dense.heads_view();
  REQUIRE(view.head_tokens != nullptr);
  CHECK(view.n_tokens == std::max(dense.head_tokens(0), dense.head_tokens(1)));
  for (int32_t h = 0; h < shape.n_kv_heads; ++h) {
    INFO("head " << h);
    const DenseKv one = dense.head_view(h);
    REQUIRE(view.tokens(h) == one.n_tokens);
    for (int64_t t = 0; t < one.n_tokens; ++t) {
      CHECK(view.position(h, t) == one.position(0, t));
      CHECK(std::equal(view.key(h, t), view.key(h, t) + shape.head_dim, one.key(0, t)));
      CHECK(std::equal(view.value(h, t), view.value(h, t) + shape.head_dim, one.value(0, t)));
    }
    if (view.tokens(h) < view.n_tokens) {
      CHECK(view.positions[h * view.capacity + view.tokens(h)] == kPaddingPosition);
      CHECK_THROWS_AS(view.key(h, view.tokens(h)), std::out_of_range);
    }
  }
  CHECK_THROWS_AS(view.tokens(2), std::out_of_range);
}

TEST_CASE("plugins: a sweep with a plugin method resumes, equals the built-in, and reports it",
          "[unit]") {
  const std::string model = tiny_model("plugin_sweep.gguf");
  const std::string db = temp_path("plugin_sweep.db");
  std::remove(db.c_str());
  const std::string config =
      sweep_config("plugin_sweep.json", ", \"plugins\": [\"" + kExample + "\"]");
  const std::string sweep = "--model " + model + " --threads 1 sweep " + config + " --db " + db;
  const Run first = run_kvbench(sweep);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  // The plugin's rows equal the built-in method's: answers, bytes and fidelity.
  const std::string rows =
      "SELECT group_concat(prediction || '|' || kv_bytes || '|' || kv_bytes_peak || '|' || "
      "tokens_kept || '|' || quote(first_token_kl) || '|' || quote(top1_agreement), ';') FROM "
      "(SELECT * FROM results WHERE method = '";
  const std::string builtin =
      sql_text(db, rows + "knorm:budget=48,skip=1' ORDER BY sample_id, turn)");
  CHECK_FALSE(builtin.empty());
  CHECK(builtin ==
        sql_text(db, rows + "example_knorm:budget=48,window=0,sink=0,skip=1' ORDER BY "
                            "sample_id, turn)"));
  CHECK(sql_text(db, "SELECT config_json FROM runs").find(
            "\"plugins\":[{\"file\":\"libexample_methods.so\",\"sha256\":\"" +
            sha256_file(kExample) + "\"}]") != std::string::npos);

  // Resumed with the plugin given on the command line instead: nothing left to run.
  const std::string bare = sweep_config("plugin_sweep_bare.json", "");
  const Run again = run_kvbench("--plugin " + kExample + " --model " + model +
                                " --threads 1 sweep " + bare + " --db " + db);
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK(again.output.find("0 units written") != std::string::npos);

  // The same bytes under another file name are the same method: nothing left to run.
  const std::string renamed = temp_path("renamed_methods.so");
  std::filesystem::copy_file(kExample, renamed, std::filesystem::copy_options::overwrite_existing);
  const Run moved = run_kvbench("--plugin " + renamed + " --model " + model +
                                " --threads 1 sweep " + bare + " --db " + db);
  INFO(moved.output);
  CHECK(moved.exit_code == 0);
  CHECK(moved.output.find("0 units written") != std::string::npos);
  // Other bytes (one appended: the same code still loads) are another method: refused, and
  // the error names the plugin on both sides.
  const std::string rebuilt = temp_path("rebuilt_methods.so");
  std::filesystem::copy_file(kExample, rebuilt, std::filesystem::copy_options::overwrite_existing);
  std::ofstream(rebuilt, std::ios::app | std::ios::binary) << '\0';
  const Run other = run_kvbench("--plugin " + rebuilt + " --model " + model +
                                " --threads 1 sweep " + bare + " --db " + db);
  INFO(other.output);
  CHECK(other.exit_code == 2);
  CHECK(other.output.find("plugin (libexample_methods.so sha256 " +
                          sha256_file(kExample).substr(0, 12) + " there, rebuilt_methods.so") !=
        std::string::npos);

  // `--rerun METHOD` after the rebuild, on a copy of the db: the plugin method's unit is
  // deleted and run again, the baselines stay as they were (their rows and run), and the db
  // then resumes with the rebuilt plugin.
  const std::string rerun_db = temp_path("plugin_rerun.db");
  std::filesystem::copy_file(db, rerun_db, std::filesystem::copy_options::overwrite_existing);
  const std::string baselines =
      "SELECT group_concat(u.id || u.method || r.prediction || r.ttft_ms, ';') FROM units u "
      "JOIN results r ON r.unit_id = u.id WHERE u.method NOT LIKE 'example%'";
  const std::string kept = sql_text(rerun_db, baselines);
  const std::string rebuilt_sweep =
      "--plugin " + rebuilt + " --model " + model + " --threads 1 sweep " + bare + " --db ";
  // A name that is no method of the sweep is refused, and nothing is deleted.
  const Run unknown = run_kvbench(rebuilt_sweep + rerun_db + " --rerun vnorm");
  INFO(unknown.output);
  CHECK(unknown.exit_code == 2);
  CHECK(unknown.output.find("--rerun vnorm: not a method of this sweep") != std::string::npos);
  // Naming a baseline alone leaves the rebuilt plugin's old unit: refused, nothing deleted.
  const Run partial = run_kvbench(rebuilt_sweep + rerun_db + " --rerun knorm:budget=48,skip=1");
  INFO(partial.output);
  CHECK(partial.exit_code == 2);
  CHECK(partial.output.find("comes from the rebuilt plugin") != std::string::npos);
  CHECK(sql_text(rerun_db, "SELECT count(*) FROM units") == "3");
  const Run rerun = run_kvbench(rebuilt_sweep + rerun_db + " --rerun example_knorm");
  INFO(rerun.output);
  CHECK(rerun.exit_code == 0);
  CHECK(rerun.output.find("--rerun: 1 unit of 1 method deleted") != std::string::npos);
  CHECK(rerun.output.find("1 unit written") != std::string::npos);
  CHECK(sql_text(rerun_db, baselines) == kept);
  CHECK(sql_text(rerun_db, "SELECT count(*) FROM units") == "3");
  CHECK(sql_text(rerun_db, rows + "example_knorm:budget=48,window=0,sink=0,skip=1' ORDER BY "
                                  "sample_id, turn)") == builtin);
  const Run resumed = run_kvbench(rebuilt_sweep + rerun_db);
  INFO(resumed.output);
  CHECK(resumed.exit_code == 0);
  CHECK(resumed.output.find("0 units written") != std::string::npos);

  // Workers of `sweep --jobs` get the command line's plugins too.
  const std::string jobs_db = temp_path("plugin_jobs.db");
  std::remove(jobs_db.c_str());
  const Run jobs = run_kvbench("--plugin " + kExample + " --model " + model + " --threads 1 " +
                               "sweep " + bare + " --db " + jobs_db + " --jobs 2");
  INFO(jobs.output);
  CHECK(jobs.exit_code == 0);
  CHECK(sql_text(jobs_db, "SELECT count(*) FROM units") == "3");

  const std::string out = temp_path("plugin_report");
  const Run report = run_kvbench("report " + db + " -o " + out);
  INFO(report.output);
  REQUIRE(report.exit_code == 0);
  const std::string md = file_text(out + "/leaderboard.md");
  CHECK(md.find("| example\\_knorm:budget=48") != std::string::npos);  // markdown escapes '_'
  CHECK(md.find("libexample\\_methods.so, sha256 " + sha256_file(kExample)) !=
        std::string::npos);
  CHECK(file_text(out + "/leaderboard.html").find(sha256_file(kExample)) != std::string::npos);
}

TEST_CASE("plugins: the speed gate fails a method that got slower beside the others", "[unit]") {
  // tests/plugins/slow_reader.cpp reads every token as the full cache does, and sleeps per
  // decode step when told to: a baseline from a run without the sleep, then a run with it.
  const std::string model = tiny_model("speed_gate.gguf");
  const std::string config = write_text("speed_gate.json", R"({"tasks": ["math_find"],
    "methods": ["full", "knorm:skip=1", "slow_reader", "streamingllm"], "budgets": [48],
    "samples": 1, "turns": 2, "context_tokens": 300, "max_new": 16, "plugins": [")" +
                                                              test_plugin("slow_reader") + "\"]}");
  const auto sweep = [&](const std::string& db, const std::string& env) {
    std::remove(db.c_str());
    const Run run = run_kvbench("--model " + model + " --threads 1 sweep " + config + " --db " + db, env);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
  };
  const std::string before = temp_path("speed_gate_before.db");
  const std::string after = temp_path("speed_gate_after.db");
  const std::string baseline = temp_path("speed_gate_baseline.json");
  sweep(before, "");
  REQUIRE(run_kvbench("check " + before + " --write-baseline " + baseline).exit_code == 0);
  // 10 ms a step, where the tiny model decodes one in a fraction of a millisecond. Its
  // timings are too noisy for the other rows to be asserted unchanged: the smoke gate in CI
  // (configs/smoke.json on the real model) is where an unchanged tree passes.
  sweep(after, "KVBENCH_TEST_DECODE_DELAY_MS=10");
  const Run check = run_kvbench("check " + after + " --baseline " + baseline);
  INFO(check.output);
  CHECK(check.exit_code == 1);
  bool slowed_named = false;
  std::istringstream lines(check.output);
  for (std::string line; std::getline(lines, line);) {
    slowed_named |= line.rfind("slow_reader", 0) == 0 && line.find("decode tok/s") != std::string::npos;
  }
  CHECK(slowed_named);
  // The same answers as before: only its speed changed.
  const std::string answers = "SELECT group_concat(prediction, '|') FROM results WHERE method = 'slow_reader'";
  CHECK(sql_text(before, answers) == sql_text(after, answers));
}

TEST_CASE("plugins: a plugin that fails inside a unit is named, exit 2, the unit unwritten",
          "[unit]") {
  const std::string model = tiny_model("plugin_failure.gguf");
  const std::string config = write_text("plugin_failure.json", R"({"tasks": ["math_find"],
    "methods": ["full", "failing_reader"], "samples": 1, "turns": 1, "context_tokens": 300,
    "max_new": 4, "shared_prefill": false, "plugins": [")" + test_plugin("fails_in_unit") + "\"]}");
  for (const char* how : {"throw", "throw42", "exit"}) {
    INFO(how);
    const std::string db = temp_path(std::string("plugin_failure_") + how + ".db");
    std::remove(db.c_str());
    const Run run = run_kvbench("--model " + model + " --threads 1 sweep " + config + " --db " + db,
                                std::string("KVBENCH_TEST_PLUGIN_FAILURE=") + how);
    INFO(run.output);
    CHECK(run.exit_code == 2);
    const std::string last = run.output.substr(run.output.rfind("kvbench: error: "));
    CHECK(last.find("failing_reader (plugin ") != std::string::npos);
    CHECK(last.find("libtest_plugin_fails_in_unit.so") != std::string::npos);
    CHECK(sql_text(db, "SELECT count(*) FROM units WHERE method = 'failing_reader'") == "0");
  }
}

namespace {

// A header's declarations as a plugin compiles them: comments dropped, whitespace runs made
// one space, and the line that records the hash itself left out.
std::string declarations(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 2, "//") == 0) {
      i = text.find('\n', i);
      if (i == std::string::npos) break;
    } else if (text.compare(i, 2, "/*") == 0) {
      const size_t end = text.find("*/", i + 2);
      i = end == std::string::npos ? text.size() : end + 2;
    } else if (std::isspace(static_cast<unsigned char>(text[i]))) {
      if (!out.empty() && out.back() != ' ') out += ' ';
      ++i;
    } else {
      out += text[i++];
    }
  }
  const size_t at = out.find("#define KVBENCH_PLUGIN_INTERFACE_HASH");
  if (at != std::string::npos) {
    const size_t close = out.find('"', out.find('"', at) + 1);
    out.erase(at, close + 1 - at);
  }
  return out;
}

}  // namespace

TEST_CASE("plugins: the interface version moves with the headers a plugin compiles against",
          "[unit]") {
  // Every seam header `cmake --install` gives a plugin (cache/*.h; cache/cuda/ is not
  // installed) and every header of the tree they include, directly or not: what a plugin and
  // the kvbench that loads it must agree on, whether plugin_api.h includes it or a plugin does
  // (a prefill method's cache/prefill_attention.h). Its hash is recorded beside the version.
  const std::string root = KVBENCH_SOURCE_DIR;
  std::set<std::string> seen;
  std::vector<std::string> todo;
  for (const auto& entry : std::filesystem::directory_iterator(root + "/cache")) {
    if (entry.is_regular_file() && entry.path().extension() == ".h") {
      todo.push_back("cache/" + entry.path().filename().string());
    }
  }
  REQUIRE(std::find(todo.begin(), todo.end(), "cache/plugin_api.h") != todo.end());
  while (!todo.empty()) {
    const std::string header = todo.back();
    todo.pop_back();
    if (!seen.insert(header).second) continue;
    std::ifstream in(root + "/" + header);
    REQUIRE(in.good());
    for (std::string line; std::getline(in, line);) {
      const size_t open = line.find("#include \"");
      if (open == std::string::npos) continue;
      const size_t start = open + 10, end = line.find('"', start);
      const std::string included = line.substr(start, end - start);
      if (std::ifstream(root + "/" + included).good()) todo.push_back(included);
    }
  }
  kvbench::Sha256 hash;
  for (const std::string& header : seen) {  // sorted: the same order on every machine
    std::ifstream in(root + "/" + header);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string decl = header + "\n" + declarations(text) + "\n";
    hash.update(decl.data(), decl.size());
  }
  const std::string recorded = KVBENCH_PLUGIN_INTERFACE_HASH;
  const std::string now = std::to_string(KVBENCH_PLUGIN_INTERFACE_VERSION) + ":" + hash.hex_digest();
  INFO("the " << seen.size() << " headers a plugin compiles against changed. If a declaration "
       "a plugin sees changed (a virtual method, a struct's members, a signature), raise "
       "KVBENCH_PLUGIN_INTERFACE_VERSION in cache/plugin_api.h; then record "
       "KVBENCH_PLUGIN_INTERFACE_HASH as \"<version>:<the new hash>\" (now " << now << ")");
  CHECK(recorded == now);
}
