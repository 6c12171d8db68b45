// The results store: SQLite in WAL mode, schema versioned (PRAGMA user_version, migrated
// forward on open). A `runs` table (who ran what: kvbench version, git sha, model sha256,
// host, command line, config JSON, start and finish) and a `results` table with one row
// per (run, task, sample, turn, method spec, budget, mode, seed) holding every metric the
// session driver records, the prediction, the reference and the score. A finished
// (sample, method) unit is written in one transaction, so a killed sweep leaves whole
// units or nothing. Only bound parameters reach SQL. Framework-free: no model, no JSON
// library (UnitRecord::head_tokens' JSON array is written and read here by hand).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/method_spec.h"

struct sqlite3;

namespace kvbench {

constexpr int kResultsSchemaVersion = 9;

struct RunRecord {
  int64_t id = 0;  // assigned by begin_run
  std::string kvbench_version;
  std::string git_sha;       // of the kvbench source, "unknown" outside a git checkout
  std::string model_path;
  std::string model_sha256;
  std::string host;
  std::string command_line;
  std::string config_json;   // the sweep's canonical config (no shard): merge compares it
  std::string started_at;    // ISO 8601 UTC, set by begin_run
  std::string finished_at;   // set by finish_run; empty while running or killed
  int64_t units = 0;         // units the db holds under this run (read back, never written)
};

// One turn of one unit: every metric the session driver records.
struct TurnRow {
  int32_t turn = 0;  // 1-based
  std::string query;
  std::string prediction;
  std::string reference;
  std::string stop_reason;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t appended_tokens = 0;
  double ttft_ms = 0;
  double tpot_ms = 0;
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;
  int64_t kv_bytes = 0;
  int64_t kv_bytes_peak = 0;
  int64_t kv_read_per_step = 0;
  double tokens_kept = 0;
  int64_t tokens_seen = 0;
  int64_t tokens_evicted = 0;
  int64_t hits = 0;         // reuse: blocks served from a tier this turn
  int64_t misses = 0;       // reuse: blocks looked up and not served (the prefix ends there)
  int64_t bytes_moved = 0;  // reuse: block bytes written into and read out of the tiers
  int64_t tokens_reused = 0;       // prompt tokens loaded instead of prefilled
  int64_t reuse_bytes_loaded = 0;  // block bytes loaded for them
  double reuse_load_ms = 0;        // lookup, checksums and copies (in ttft_ms)
  // Per tier after the turn, ";"-joined:
  // "name:hits/misses/KiB in/KiB out/faults/KiB resident/load ms".
  std::string reuse_tiers;
  std::string reuse_faults;  // what went wrong this turn (Redis gone, a corrupt block), "" if nothing
  // Attention FLOPs of the prefill counted in ttft_ms (QK^T and PV: 4 * head_dim per query
  // head and (query, key) pair read), and what a dense causal prefill of the same rows
  // computes: a sparse prefill does less. 0 where not counted (before schema v6).
  double attn_flops = 0;
  double attn_flops_dense = 0;
  // A retrieval read policy's recall of each decode query's true top keys, averaged over the
  // turn's decode steps; null for other methods.
  std::optional<double> retrieval_recall;
  std::optional<double> first_token_kl;   // null without a fidelity reference
  std::optional<double> top1_agreement;
  std::optional<double> score;            // null for a sample without a task
};

// A finished (sample, method) unit with its turns.
// The parts the store writes beside a spec (UnitRecord::parts): method_parts of its syntax, or
// the text itself as family and series where it does not parse (an edited db).
MethodParts stored_method_parts(const std::string& method);

struct UnitRecord {
  std::string key;        // unique per sweep (what a resumed sweep skips)
  int64_t run_id = 0;     // the run that wrote it (filled when read back)
  std::string task;
  std::string sample_id;
  std::string method;     // canonical spec
  std::string budget;     // "budget=256", "ratio=0.25", or "" (full)
  // The spec's parts as the reports group by them (common/method_spec.h, schema v9): written
  // from `method` (what a record holds is not read), read back from their columns; a db of
  // an older schema has them filled in as it is migrated.
  MethodParts parts;
  std::string mode;       // "multi-turn" / "multi-request"
  uint64_t seed = 0;
  int64_t context_tokens = 0;
  double context_prefill_ms = 0;
  // How the context went in: "dense", "stream:N" (evicting every N tokens), or "" (a db
  // written before schema v4).
  std::string prefill;
  bool shared_prefill = false;   // forked from the sample's one prefill for all methods
  int64_t prefilled_tokens = 0;  // context tokens the unit ran through the model itself
  // Tokens each KV head held after the unit's first turn (its context compressed, the first
  // answer appended), [layer][kv head], and the tokens the cache had seen by then: what the
  // report's heat map divides. Empty and 0 for a db written before schema v5.
  std::vector<std::vector<int64_t>> head_tokens;
  int64_t head_tokens_seen = 0;
  // "agnostic" (the context compressed before any question) or "aware" (the first turn's
  // query inside the compressed span); "" for a db written before schema v6.
  std::string query_setting;
  double turn_gap_s = 0;  // simulated seconds between a unit's requests or turns (TTL reuse)
  // Where the sweep's time went (schema v8; 0 in older dbs). wall_ms: from the previous unit
  // written by the same process (or the run's start) to this one, so a shard's units add up
  // to its time. shared_forward_ms: the sample's one forward for every method that shares it,
  // each method's observers included, when it ran inside this unit's wall time (0 on the
  // sample's later units). reference_ms: the full cache's session the fidelity columns
  // compare against, when it ran inside this unit's wall time and is not the unit's own.
  double wall_ms = 0;
  double shared_forward_ms = 0;
  double reference_ms = 0;
  std::vector<TurnRow> turns;
};

// One request of a serving run (`kvbench load`): a turn of a user's session sent to an
// OpenAI-compatible endpoint while others ran beside it, as its client timed it.
struct ServingRow {
  int64_t run_id = 0;       // filled when read back
  std::string label;        // what served it: "kvbench serve" or a name the user gave
  std::string endpoint;     // http://host:port
  std::string method;       // the kvbench method asked for, "" for none (another server)
  int32_t concurrency = 0;  // sessions in flight at once
  int64_t pool_bytes = 0;   // the server's KV pool, where it said (0: not known)
  std::string task;
  std::string sample_id;    // the user's sample
  int32_t turn = 0;         // 1-based
  double start_s = 0;       // sent, seconds after this concurrency level's first request
  double ttft_ms = 0;       // sent -> first text received
  double itl_ms = 0;        // mean gap between tokens after the first
  double e2e_ms = 0;        // sent -> last byte
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens the server reused (its usage said), else 0
  std::string prediction;
  std::string reference;
  std::optional<double> score;  // null when the request failed
  std::string error;            // "" when it was answered
};

class ResultsDb {
 public:
  // Opens `path`, creating it (and migrating an older schema) unless read_only. Throws
  // InputError with one line naming the path when it cannot be created or opened
  // (unwritable directory or file), is not a SQLite database or is corrupt, is locked by
  // another writer past a busy timeout, or has a schema newer than this kvbench.
  static std::unique_ptr<ResultsDb> open(const std::string& path, bool read_only = false);
  ~ResultsDb();
  ResultsDb(const ResultsDb&) = delete;
  ResultsDb& operator=(const ResultsDb&) = delete;

  const std::string& path() const { return path_; }

  int64_t begin_run(const RunRecord& run);  // returns the run id; started_at = now
  void finish_run(int64_t run_id);          // finished_at = now
  std::vector<RunRecord> runs() const;      // by id

  std::set<std::string> finished_unit_keys() const;
  // `sweep --rerun`: deletes the units of `methods` (canonical specs) with their turns and
  // records `config_json` as every run's config (a rebuilt plugin's new sha256), in one
  // transaction; the sweep then resumes them. Returns the units deleted.
  int64_t forget_methods(const std::set<std::string>& methods, const std::string& config_json);
  // The unit and all its turn rows in one transaction; a unit whose key is already there
  // is an error (std::logic_error: the sweep should have skipped it).
  void write_unit(int64_t run_id, const UnitRecord& unit);
  std::vector<UnitRecord> units() const;  // with turns, in the order they were written

  // A serving run's requests, in one transaction.
  void write_serving(int64_t run_id, const std::vector<ServingRow>& rows);
  std::vector<ServingRow> serving_rows() const;  // in the order they were written

 private:
  explicit ResultsDb(std::string path);
  std::string path_;
  sqlite3* db_ = nullptr;
};

// `kvbench merge`: copies the runs and units of every input into a new db at `output`
// (which must not exist). Throws InputError naming the inputs that differ when their runs'
// config_json or model_sha256 differ from the first input's, when a unit key occurs in two
// inputs, or for any input that cannot be opened; and, unless `allow_mixed_commits`, when
// runs that hold units were made by different kvbench commits (git_sha): a table of one
// sweep should be one code's.
void merge_results(const std::vector<std::string>& inputs, const std::string& output,
                   bool allow_mixed_commits = false);

}  // namespace kvbench
