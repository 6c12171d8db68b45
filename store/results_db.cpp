// The SQLite results store: see results_db.h and store/README.md.
#include "store/results_db.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <utility>

#include "common/files.h"
#include "common/input_error.h"
#include "common/utf8.h"
#include "store/run_identity.h"

namespace kvbench {
namespace {

constexpr int kBusyTimeoutMs = 5000;

// ---------------------------------------------------------------------------------------
// Messages

std::string sqlite_detail(sqlite3* db, int rc) {
  std::string detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  if (db != nullptr) {
    const int sys = sqlite3_system_errno(db);
    if (sys != 0 && (rc & 0xff) != SQLITE_NOTADB && (rc & 0xff) != SQLITE_CORRUPT) {
      detail += std::string(": ") + std::strerror(sys);
    }
  }
  return one_line(detail);
}

bool is_busy(int rc) { return (rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED; }

[[noreturn]] void throw_locked(const std::string& path) {
  throw InputError(one_line(path) + ": the results db is locked by another process");
}

// An error while opening: one InputError line naming the path and the kind of trouble.
[[noreturn]] void throw_open_error(const std::string& path, bool read_only, sqlite3* db,
                                   int rc) {
  const std::string p = one_line(path);
  const int primary = rc & 0xff;
  if (is_busy(rc)) throw_locked(path);
  if (primary == SQLITE_NOTADB || primary == SQLITE_CORRUPT) {
    throw InputError(p + ": not a kvbench results db (" + sqlite_detail(db, rc) + ")");
  }
  std::string detail = sqlite_detail(db, rc);
  if (!read_only && primary == SQLITE_CANTOPEN) {
    // SQLite retries a failed create read-only, so its errno can mislead: say what is wrong
    // with the directory.
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) {
      const size_t slash = path.find_last_of('/');
      const std::string dir =
          slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
      if (stat(dir.c_str(), &st) != 0) {
        detail = "directory " + one_line(dir) + ": " + std::strerror(errno);
      } else if (!S_ISDIR(st.st_mode)) {
        detail = one_line(dir) + " is not a directory";
      } else if (access(dir.c_str(), W_OK | X_OK) != 0) {
        detail = "directory " + one_line(dir) + " is not writable";
      }
    }
  }
  throw InputError(p + ": cannot open the results db for " +
                   (read_only ? "reading" : "writing") + " (" + detail + ")");
}

// An error after a successful open (a query or a write). The db is the user's file: a corrupt
// or truncated one, tables with other columns (SQLite's "no such column"), a full disk or a
// read-only file are bad input, one InputError line; only misuse of SQLite's API (a bug
// here) is a runtime_error.
[[noreturn]] void throw_db_error(const std::string& path, sqlite3* db, int rc,
                                 const std::string& what) {
  if (is_busy(rc)) throw_locked(path);
  const int primary = rc & 0xff;
  const std::string detail = sqlite_detail(db, rc);
  if (primary == SQLITE_MISUSE || primary == SQLITE_RANGE || primary == SQLITE_NOMEM) {
    throw std::runtime_error(one_line(path) + ": results db: " + what + " failed (" + detail + ")");
  }
  const char* kind = primary == SQLITE_CORRUPT || primary == SQLITE_NOTADB
                         ? "corrupt, or not a kvbench results db"
                     : primary == SQLITE_ERROR ? "not a kvbench results db of this version"
                                               : "cannot use the results db";
  throw InputError(one_line(path) + ": " + kind + " (" + what + ": " + detail + ")");
}

// ---------------------------------------------------------------------------------------
// Connection and statements

struct CloseDb {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using DbPtr = std::unique_ptr<sqlite3, CloseDb>;

// A prepared statement; every error it raises goes through `on_error(rc, what)`.
class Stmt {
 public:
  using OnError = std::function<void(int rc, const std::string& what)>;

  Stmt(sqlite3* db, const char* sql, OnError on_error)
      : db_(db), sql_(sql), on_error_(std::move(on_error)) {
    const int rc = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
    if (rc != SQLITE_OK) fail(rc, "prepare");
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  // Binding: 1-based parameter indexes. Text keeps every byte (NULs included).
  Stmt& bind(int i, const std::string& v) {
    return check(sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()),
                                   SQLITE_TRANSIENT));
  }
  Stmt& bind(int i, int64_t v) { return check(sqlite3_bind_int64(stmt_, i, v)); }
  Stmt& bind(int i, double v) { return check(sqlite3_bind_double(stmt_, i, v)); }
  Stmt& bind(int i, const std::optional<double>& v) {
    return v ? bind(i, *v) : check(sqlite3_bind_null(stmt_, i));
  }
  Stmt& bind(int i, const std::optional<int64_t>& v) {
    return v ? bind(i, *v) : check(sqlite3_bind_null(stmt_, i));
  }
  Stmt& bind_null(int i) { return check(sqlite3_bind_null(stmt_, i)); }

  // One step: true while a row is ready, false when done.
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail(sqlite3_extended_errcode(db_), "step");
  }
  void run() {
    while (step()) {
    }
  }
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  int type(int col) const { return sqlite3_column_type(stmt_, col); }
  int bytes(int col) const { return sqlite3_column_bytes(stmt_, col); }
  bool is_null(int col) const { return type(col) == SQLITE_NULL; }
  int64_t int64(int col) const { return sqlite3_column_int64(stmt_, col); }
  double real(int col) const { return sqlite3_column_double(stmt_, col); }
  std::optional<double> opt_real(int col) const {
    if (is_null(col)) return std::nullopt;
    return real(col);
  }
  std::string text(int col) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, col));
    const int n = sqlite3_column_bytes(stmt_, col);
    return p != nullptr ? std::string(p, static_cast<size_t>(n)) : std::string();
  }

 private:
  Stmt& check(int rc) {
    if (rc != SQLITE_OK) fail(rc, "bind");
    return *this;
  }
  [[noreturn]] void fail(int rc, const std::string& what) {
    on_error_(rc, what + " of " + short_sql());
    throw std::logic_error("Stmt error handler returned");  // on_error_ always throws
  }

  // The statement as an error names it: its verb and table ("INSERT INTO results",
  // "SELECT FROM units"), not its text, so that the error stays short.
  std::string short_sql() const {
    const size_t from = sql_.find(" FROM ");
    if (sql_.rfind("SELECT", 0) == 0 && from != std::string::npos) {
      const size_t table = from + 6;
      return "SELECT FROM " + sql_.substr(table, sql_.find_first_of(" ;", table) - table);
    }
    return sql_.substr(0, std::min(sql_.find(" ("), size_t{40}));
  }

  sqlite3* db_;
  std::string sql_;
  OnError on_error_;
  sqlite3_stmt* stmt_ = nullptr;
};

// A row read back. The db is the user's file, and may have been edited or forged: every
// value is type- and range-checked here, once, before anything uses it (a turn index of
// 2^31 would size a per-turn array; 'abc' would read as 0; a score of 7 would show as
// 700%). A bad value is an InputError naming the db, table, column and row.
class CheckedRow {
 public:
  static constexpr int64_t kMaxCount = int64_t{1} << 53;  // exact in a double
  static constexpr size_t kMaxText = size_t{16} << 20;

  CheckedRow(const Stmt& s, const std::string& path, const char* table)
      : s_(s), path_(path), table_(table), row_(s.int64(0)) {}

  int64_t row_id() const { return row_; }

  int64_t integer(int col, const char* column, int64_t lo, int64_t hi) const {
    if (s_.type(col) != SQLITE_INTEGER) fail(column, "not an integer");
    const int64_t v = s_.int64(col);
    if (v < lo || v > hi) {
      fail(column, std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
    }
    return v;
  }
  int64_t count(int col, const char* column) const { return integer(col, column, 0, kMaxCount); }

  double real(int col, const char* column, double lo, double hi) const {
    const int t = s_.type(col);
    if (t != SQLITE_FLOAT && t != SQLITE_INTEGER) fail(column, "not a number");
    const double v = s_.real(col);
    if (!(v >= lo && v <= hi)) {
      char text[96];
      std::snprintf(text, sizeof text, "%g is outside [%g, %g]", v, lo, hi);
      fail(column, text);
    }
    return v;
  }
  std::optional<double> opt_real(int col, const char* column, double lo, double hi) const {
    if (s_.is_null(col)) return std::nullopt;
    return real(col, column, lo, hi);
  }
  std::optional<int64_t> opt_integer(int col, const char* column, int64_t lo, int64_t hi) const {
    if (s_.is_null(col)) return std::nullopt;
    return integer(col, column, lo, hi);
  }

  std::string text(int col, const char* column, size_t max_bytes = kMaxText) const {
    if (s_.type(col) != SQLITE_TEXT) fail(column, "not text");
    if (static_cast<size_t>(s_.bytes(col)) > max_bytes) {
      fail(column, "longer than " + std::to_string(max_bytes) + " bytes");
    }
    return s_.text(col);  // every byte, as the model wrote it
  }
  // A name that groups rows and keys a baseline (task, method, mode...): valid UTF-8, so that
  // a baseline written from it reads back with the same key.
  std::string label(int col, const char* column) const { return valid_utf8(text(col, column)); }
  std::string opt_text(int col, const char* column) const {  // NULL reads as ""
    return s_.is_null(col) ? std::string() : text(col, column);
  }

  [[noreturn]] void fail(const char* column, const std::string& why) const {
    throw InputError(one_line(path_) + ": " + table_ + "." + column + " of row " +
                     std::to_string(row_) + ": " + one_line(why));
  }

 private:
  const Stmt& s_;
  const std::string& path_;
  const char* table_;
  int64_t row_;
};

Stmt::OnError db_errors(const std::string& path, sqlite3* db) {
  return [path, db](int rc, const std::string& what) { throw_db_error(path, db, rc, what); };
}

void exec(sqlite3* db, const char* sql, const Stmt::OnError& on_error) {
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) on_error(sqlite3_extended_errcode(db), std::string("\"") + sql + "\"");
}

// BEGIN IMMEDIATE ... COMMIT; rolls back when destroyed uncommitted.
class Transaction {
 public:
  Transaction(sqlite3* db, Stmt::OnError on_error) : db_(db), on_error_(std::move(on_error)) {
    exec(db_, "BEGIN IMMEDIATE", on_error_);
    open_ = true;
  }
  ~Transaction() {
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  void commit() {
    exec(db_, "COMMIT", on_error_);
    open_ = false;
  }

 private:
  sqlite3* db_;
  Stmt::OnError on_error_;
  bool open_ = false;
};

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// ---------------------------------------------------------------------------------------
// Schema and migrations

// migrations[v - 1] takes a db from user_version v - 1 to v. A new schema version is one
// more entry here (and kResultsSchemaVersion one higher).
const char* const kMigrations[] = {
    // v1
    R"sql(
CREATE TABLE runs (
  id INTEGER PRIMARY KEY,
  kvbench_version TEXT NOT NULL,
  git_sha TEXT NOT NULL,
  model_path TEXT NOT NULL,
  model_sha256 TEXT NOT NULL,
  host TEXT NOT NULL,
  command_line TEXT NOT NULL,
  config_json TEXT NOT NULL,
  started_at TEXT NOT NULL,
  finished_at TEXT
);
CREATE TABLE units (
  id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL REFERENCES runs(id),
  unit_key TEXT NOT NULL UNIQUE,
  task TEXT NOT NULL,
  sample_id TEXT NOT NULL,
  method TEXT NOT NULL,
  budget TEXT NOT NULL,
  mode TEXT NOT NULL,
  seed INTEGER NOT NULL,
  context_tokens INTEGER NOT NULL,
  context_prefill_ms REAL NOT NULL,
  finished_at TEXT NOT NULL
);
CREATE INDEX units_run ON units(run_id);
CREATE TABLE results (
  id INTEGER PRIMARY KEY,
  unit_id INTEGER NOT NULL REFERENCES units(id),
  run_id INTEGER NOT NULL REFERENCES runs(id),
  task TEXT NOT NULL,
  sample_id TEXT NOT NULL,
  turn INTEGER NOT NULL,
  method TEXT NOT NULL,
  budget TEXT NOT NULL,
  mode TEXT NOT NULL,
  seed INTEGER NOT NULL,
  query TEXT NOT NULL,
  prediction TEXT NOT NULL,
  reference TEXT NOT NULL,
  stop_reason TEXT NOT NULL,
  prompt_tokens INTEGER NOT NULL,
  output_tokens INTEGER NOT NULL,
  appended_tokens INTEGER NOT NULL,
  ttft_ms REAL NOT NULL,
  tpot_ms REAL NOT NULL,
  prefill_tokens_per_s REAL NOT NULL,
  decode_tokens_per_s REAL NOT NULL,
  kv_bytes INTEGER NOT NULL,
  kv_bytes_peak INTEGER NOT NULL,
  tokens_kept REAL NOT NULL,
  tokens_seen INTEGER NOT NULL,
  tokens_evicted INTEGER NOT NULL,
  hits INTEGER NOT NULL,
  misses INTEGER NOT NULL,
  bytes_moved INTEGER NOT NULL,
  first_token_kl REAL,
  top1_agreement REAL,
  score REAL,
  UNIQUE(unit_id, turn)
);
CREATE INDEX results_run ON results(run_id);
CREATE INDEX results_method ON results(task, method, budget, mode);
)sql",
    // v2: bytes attention read per decode step (Quest, KIVI)
    R"sql(
ALTER TABLE results ADD COLUMN kv_read_per_step INTEGER NOT NULL DEFAULT 0;
)sql",
    // v3: reuse across requests (prefix blocks and their tiers)
    R"sql(
ALTER TABLE results ADD COLUMN tokens_reused INTEGER NOT NULL DEFAULT 0;
ALTER TABLE results ADD COLUMN reuse_bytes_loaded INTEGER NOT NULL DEFAULT 0;
ALTER TABLE results ADD COLUMN reuse_load_ms REAL NOT NULL DEFAULT 0;
ALTER TABLE results ADD COLUMN reuse_tiers TEXT NOT NULL DEFAULT '';
ALTER TABLE results ADD COLUMN reuse_faults TEXT NOT NULL DEFAULT '';
)sql",
    // v4: how each unit's context went in (dense or streamed, shared with other methods)
    R"sql(
ALTER TABLE units ADD COLUMN prefill TEXT NOT NULL DEFAULT '';
ALTER TABLE units ADD COLUMN shared_prefill INTEGER NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN prefilled_tokens INTEGER NOT NULL DEFAULT 0;
)sql",
    // v5: tokens each KV head held after the first turn (the report's heat map)
    R"sql(
ALTER TABLE units ADD COLUMN head_tokens TEXT NOT NULL DEFAULT '';
ALTER TABLE units ADD COLUMN head_tokens_seen INTEGER NOT NULL DEFAULT 0;
)sql",
    // v6: sparse prefill's attention FLOPs, retrieval recall, query setting, turn gaps
    R"sql(
ALTER TABLE units ADD COLUMN query_setting TEXT NOT NULL DEFAULT '';
ALTER TABLE units ADD COLUMN turn_gap_s REAL NOT NULL DEFAULT 0;
ALTER TABLE results ADD COLUMN attn_flops REAL NOT NULL DEFAULT 0;
ALTER TABLE results ADD COLUMN attn_flops_dense REAL NOT NULL DEFAULT 0;
ALTER TABLE results ADD COLUMN retrieval_recall REAL;
)sql",
    // v7: serving runs (`kvbench load`): one row per request sent to an endpoint
    R"sql(
CREATE TABLE serving (
  id INTEGER PRIMARY KEY,
  run_id INTEGER NOT NULL REFERENCES runs(id),
  label TEXT NOT NULL,
  endpoint TEXT NOT NULL,
  method TEXT NOT NULL,
  concurrency INTEGER NOT NULL,
  pool_bytes INTEGER NOT NULL,
  task TEXT NOT NULL,
  sample_id TEXT NOT NULL,
  turn INTEGER NOT NULL,
  start_s REAL NOT NULL,
  ttft_ms REAL NOT NULL,
  itl_ms REAL NOT NULL,
  e2e_ms REAL NOT NULL,
  prompt_tokens INTEGER NOT NULL,
  output_tokens INTEGER NOT NULL,
  cached_tokens INTEGER NOT NULL,
  prediction TEXT NOT NULL,
  reference TEXT NOT NULL,
  score REAL,
  error TEXT NOT NULL
);
CREATE INDEX serving_run ON serving(run_id);
)sql",
    // v8: where a unit's wall time went
    R"sql(
ALTER TABLE units ADD COLUMN wall_ms REAL NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN shared_forward_ms REAL NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN reference_ms REAL NOT NULL DEFAULT 0;
)sql",
    // v9: the spec's parts, so that reports read columns (filled from method: fill_parts)
    R"sql(
ALTER TABLE units ADD COLUMN method_family TEXT NOT NULL DEFAULT '';
ALTER TABLE units ADD COLUMN method_series TEXT NOT NULL DEFAULT '';
ALTER TABLE units ADD COLUMN budget_tokens INTEGER;
)sql",
};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == kResultsSchemaVersion,
              "one migration per schema version");

const char* const kTables[] = {"runs", "units", "results", "serving"};

int64_t user_version(sqlite3* db, const Stmt::OnError& on_error) {
  Stmt s(db, "PRAGMA user_version", on_error);
  return s.step() ? s.int64(0) : 0;
}

int64_t count_schema_objects(sqlite3* db, const Stmt::OnError& on_error) {
  Stmt s(db, "SELECT count(*) FROM sqlite_master", on_error);
  return s.step() ? s.int64(0) : 0;
}

}  // namespace

MethodParts stored_method_parts(const std::string& method) {
  try {
    return method_parts(parse_method_spec(method));
  } catch (const InputError&) {
    return MethodParts{method, method, std::nullopt};
  }
}

namespace {

// v9's columns for the units written before it.
void fill_parts(sqlite3* db, const Stmt::OnError& on_error) {
  std::vector<std::string> methods;
  {
    Stmt s(db, "SELECT DISTINCT method FROM units WHERE typeof(method) = 'text'", on_error);
    while (s.step()) methods.push_back(s.text(0));
  }
  Stmt u(db,
         "UPDATE units SET method_family = ?1, method_series = ?2, budget_tokens = ?3 "
         "WHERE method = ?4",
         on_error);
  for (const std::string& method : methods) {
    const MethodParts parts = stored_method_parts(method);
    u.bind(1, parts.family).bind(2, parts.series).bind(3, parts.budget_tokens).bind(4, method).run();
    u.reset();
  }
}

// Runs the migrations from the db's version up to kResultsSchemaVersion in one transaction.
void migrate(sqlite3* db, const std::string& path, const Stmt::OnError& on_error) {
  Transaction tx(db, on_error);
  const int64_t from = user_version(db, on_error);  // again: another process may have won
  if (from > kResultsSchemaVersion) {
    throw InputError(one_line(path) + ": results db schema version " + std::to_string(from) +
                     " is newer than this kvbench (version " +
                     std::to_string(kResultsSchemaVersion) + "); use a newer kvbench");
  }
  if (from == 0 && count_schema_objects(db, on_error) != 0) {
    throw InputError(one_line(path) +
                     ": not a kvbench results db (a SQLite db with other tables)");
  }
  for (int64_t v = from + 1; v <= kResultsSchemaVersion; ++v) {
    exec(db, kMigrations[v - 1], on_error);
    if (v == 9) fill_parts(db, on_error);
    // PRAGMA takes no bound parameters; v is an integer of ours, not input.
    exec(db, ("PRAGMA user_version = " + std::to_string(v)).c_str(), on_error);
  }
  tx.commit();
}

// A table's column names in order; empty when there is no such table.
std::vector<std::string> table_columns(sqlite3* db, const std::string& table,
                                       const Stmt::OnError& on_error) {
  // PRAGMA takes no bound parameters; the table names are this file's constants.
  Stmt s(db, ("PRAGMA table_info(" + table + ")").c_str(), on_error);
  std::vector<std::string> names;
  while (s.step()) names.push_back(s.text(1));
  return names;
}

// The columns of each table as this kvbench's migrations make them, read once from an
// in-memory db.
const std::map<std::string, std::vector<std::string>>& expected_columns() {
  static const std::map<std::string, std::vector<std::string>> columns = [] {
    sqlite3* raw = nullptr;
    sqlite3_open(":memory:", &raw);
    const DbPtr db(raw);
    const Stmt::OnError on_error = [](int rc, const std::string& what) {
      throw std::logic_error("results schema: " + what + " failed (" + std::to_string(rc) + ")");
    };
    migrate(db.get(), ":memory:", on_error);
    std::map<std::string, std::vector<std::string>> out;
    for (const char* table : kTables) out[table] = table_columns(db.get(), table, on_error);
    return out;
  }();
  return columns;
}

// The indexes of this kvbench's migrations, read once from an in-memory db.
const std::set<std::string>& expected_indexes() {
  static const std::set<std::string> names = [] {
    sqlite3* raw = nullptr;
    sqlite3_open(":memory:", &raw);
    const DbPtr db(raw);
    const Stmt::OnError on_error = [](int rc, const std::string& what) {
      throw std::logic_error("results schema: " + what + " failed (" + std::to_string(rc) + ")");
    };
    migrate(db.get(), ":memory:", on_error);
    std::set<std::string> out;
    Stmt s(db.get(), "SELECT name FROM sqlite_master WHERE type = 'index'", on_error);
    while (s.step()) out.insert(s.text(0));
    return out;
  }();
  return names;
}

// The directory a path is in.
std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

// A WAL db in a directory nobody can write (a read-only mount, a shared archive) cannot be
// opened even for reading: SQLite needs to create its -shm file. Without a WAL file to
// merge, SQLite's immutable mode reads it as it is. Returns the name to open and whether it
// is a URI.
std::pair<std::string, bool> name_for_reading(const std::string& path) {
  if (access(directory_of(path).c_str(), W_OK) == 0) return {path, false};
  struct stat wal {};
  if (stat((path + "-wal").c_str(), &wal) == 0 && wal.st_size > 0) {
    throw InputError(one_line(path) + ": cannot read the results db: its -wal file holds "
                     "writes not yet merged and its directory is read-only (copy the db with "
                     "its -wal file somewhere writable)");
  }
  static const char kHex[] = "0123456789ABCDEF";
  std::string uri = "file:";
  for (const char ch : path) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '/' || c == '.' || c == '-' || c == '_' || c == '~') {
      uri += ch;
    } else {
      uri += '%';
      uri += kHex[c >> 4];
      uri += kHex[c & 15];
    }
  }
  return {uri + "?immutable=1", true};
}

// Opens and verifies (and, for writing, creates or migrates) a kvbench results db.
DbPtr open_connection(const std::string& path, bool read_only) {
  // SQLite reads "file:..." as a URI naming some other file (or options), which the checks
  // that an output is not an input cannot see through: a db is named by its path alone.
  if (path.rfind("file:", 0) == 0) {
    throw InputError(one_line(path) + ": a results db is named by its path, not a SQLite URI "
                     "(write ./" + one_line(path) + " for a file of that name)");
  }
  // A FIFO would block SQLite's open for ever, a device be read as a db.
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    throw InputError(one_line(path) + ": the results db is not a regular file");
  }
  sqlite3* raw = nullptr;
  int flags = read_only ? SQLITE_OPEN_READONLY : (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
  std::string name = path;
  if (read_only) {
    const auto [readable_name, uri] = name_for_reading(path);
    name = readable_name;
    if (uri) flags |= SQLITE_OPEN_URI;
  }
  const int rc = sqlite3_open_v2(name.c_str(), &raw, flags | SQLITE_OPEN_NOMUTEX, nullptr);
  DbPtr db(raw);
  if (rc != SQLITE_OK) throw_open_error(path, read_only, db.get(), rc);
  sqlite3_extended_result_codes(db.get(), 1);
  if (!read_only && sqlite3_db_readonly(db.get(), "main") == 1) {
    throw InputError(one_line(path) +
                     ": cannot open the results db for writing (the file is read-only)");
  }
  sqlite3_busy_timeout(db.get(), kBusyTimeoutMs);

  sqlite3* handle = db.get();
  const Stmt::OnError on_open_error = [&path, read_only, &handle](int code, const std::string&) {
    throw_open_error(path, read_only, handle, code);
  };
  exec(handle, "PRAGMA foreign_keys = ON", on_open_error);

  const int64_t version = user_version(handle, on_open_error);
  if (version > kResultsSchemaVersion) {
    throw InputError(one_line(path) + ": results db schema version " +
                     std::to_string(version) + " is newer than this kvbench (version " +
                     std::to_string(kResultsSchemaVersion) + "); use a newer kvbench");
  }
  if (version < 0) {
    throw InputError(one_line(path) + ": not a kvbench results db (schema version " +
                     std::to_string(version) + ")");
  }
  if (version == 0 && count_schema_objects(handle, on_open_error) != 0) {
    throw InputError(one_line(path) +
                     ": not a kvbench results db (a SQLite db with other tables)");
  }
  if (read_only) {
    if (version == 0) {
      throw InputError(one_line(path) + ": not a kvbench results db (an empty database)");
    }
    if (version < kResultsSchemaVersion) {
      // An older db is read through a copy in memory migrated there: the file stays as it
      // is (a committed db, a shard on read-only media).
      sqlite3* raw_copy = nullptr;
      const int open_rc = sqlite3_open_v2(":memory:", &raw_copy,
                                          SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
      DbPtr copy(raw_copy);
      if (open_rc != SQLITE_OK) throw_open_error(path, read_only, copy.get(), open_rc);
      sqlite3_backup* backup = sqlite3_backup_init(copy.get(), "main", handle, "main");
      if (!backup) throw_open_error(path, read_only, copy.get(), sqlite3_errcode(copy.get()));
      sqlite3_backup_step(backup, -1);
      const int copy_rc = sqlite3_backup_finish(backup);
      if (copy_rc != SQLITE_OK) throw_open_error(path, read_only, copy.get(), copy_rc);
      db = std::move(copy);
      handle = db.get();
      sqlite3_extended_result_codes(handle, 1);
      exec(handle, "PRAGMA foreign_keys = ON", on_open_error);
      migrate(handle, path, on_open_error);
    }
  } else if (version < kResultsSchemaVersion) {
    migrate(handle, path, on_open_error);  // one transaction: all of it or nothing
  }
  // The tables and their columns before anything else is changed: a foreign db with tables
  // of these names is refused before it is switched to WAL.
  const std::map<std::string, std::vector<std::string>>& expected = expected_columns();
  for (const auto& [table, columns] : expected) {
    const std::vector<std::string> found = table_columns(handle, table, on_open_error);
    if (found != columns) {
      throw InputError(one_line(path) + ": not a kvbench results db (" +
                       (found.empty() ? "no table " + table
                                      : "table " + table + " has other columns") +
                       ")");
    }
  }
  // Nothing in the schema that kvbench did not make: a trigger could delete what a sweep
  // writes (its "4 units written" a lie), a view stand in for a table. Checked before the db
  // is read or written.
  {
    Stmt objects(handle, "SELECT type, name FROM sqlite_master", on_open_error);
    while (objects.step()) {
      const std::string type = objects.text(0), name = objects.text(1);
      const bool ours = (type == "table" && expected.count(name) > 0) ||
                        (type == "index" && (expected_indexes().count(name) > 0 ||
                                             name.rfind("sqlite_autoindex_", 0) == 0));
      if (!ours) {
        throw InputError(one_line(path) + ": not a kvbench results db (it holds a " + type +
                         " '" + one_line(name) + "' kvbench did not make)");
      }
    }
  }
  if (!read_only) {
    {
      Stmt wal(handle, "PRAGMA journal_mode = WAL", on_open_error);
      const std::string mode = wal.step() ? wal.text(0) : std::string();
      if (mode != "wal") {
        throw InputError(one_line(path) +
                         ": cannot open the results db for writing (cannot switch to WAL "
                         "mode: journal mode is " + one_line(mode) + ")");
      }
    }
    // Take the write lock once: another writer holding it past the timeout is reported now
    // rather than at the first finished unit.
    Transaction probe(handle, on_open_error);
    probe.commit();
  }
  return db;
}

// ---------------------------------------------------------------------------------------
// Rows

void insert_run(sqlite3* db, const Stmt::OnError& on_error, const RunRecord& run,
                std::optional<int64_t> id) {
  Stmt s(db,
         "INSERT INTO runs (id, kvbench_version, git_sha, model_path, model_sha256, host, "
         "command_line, config_json, started_at, finished_at) "
         "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
         on_error);
  if (id) {
    s.bind(1, *id);
  } else {
    s.bind_null(1);
  }
  s.bind(2, run.kvbench_version)
      .bind(3, run.git_sha)
      .bind(4, run.model_path)
      .bind(5, run.model_sha256)
      .bind(6, run.host)
      .bind(7, run.command_line)
      .bind(8, run.config_json)
      .bind(9, run.started_at);
  if (run.finished_at.empty()) {
    s.bind_null(10);
  } else {
    s.bind(10, run.finished_at);
  }
  s.run();
}

std::vector<RunRecord> read_runs(sqlite3* db, const std::string& path,
                                 const Stmt::OnError& on_error) {
  Stmt s(db,
         "SELECT id, kvbench_version, git_sha, model_path, model_sha256, host, command_line, "
         "config_json, started_at, finished_at, "
         "(SELECT count(*) FROM units WHERE units.run_id = runs.id) FROM runs ORDER BY id",
         on_error);
  std::vector<RunRecord> runs;
  while (s.step()) {
    const CheckedRow row(s, path, "runs");
    RunRecord r;
    r.id = row.integer(0, "id", 1, CheckedRow::kMaxCount);
    r.kvbench_version = row.text(1, "kvbench_version");
    r.git_sha = row.text(2, "git_sha");
    r.model_path = row.text(3, "model_path");
    r.model_sha256 = row.text(4, "model_sha256");
    r.host = row.text(5, "host");
    r.command_line = row.text(6, "command_line");
    r.config_json = row.text(7, "config_json");
    r.started_at = row.text(8, "started_at");
    r.finished_at = row.opt_text(9, "finished_at");  // NULL: unfinished
    r.units = row.integer(10, "units", 0, CheckedRow::kMaxCount);
    runs.push_back(std::move(r));
  }
  return runs;
}

std::set<std::string> read_unit_keys(sqlite3* db, const Stmt::OnError& on_error) {
  Stmt s(db, "SELECT unit_key FROM units", on_error);
  std::set<std::string> keys;
  while (s.step()) keys.insert(s.text(0));
  return keys;
}

// A double that SQLite can store in a NOT NULL REAL column (NaN would become NULL).
void check_real(const std::string& path, const UnitRecord& unit, int32_t turn,
                const char* field, double v) {
  if (std::isnan(v)) {
    throw std::invalid_argument(one_line(path) + ": unit " + one_line(unit.key) +
                                (turn > 0 ? " turn " + std::to_string(turn) : std::string()) +
                                ": " + field + " is NaN, which the results db cannot store");
  }
}

// UnitRecord::head_tokens as its column holds it: a JSON array of one array per layer
// ("[[12,12],[10,14]]"), so that plain SQL reads it with json_extract; "" when empty.
std::string encode_head_tokens(const std::string& path, const UnitRecord& unit) {
  std::string out;
  if (unit.head_tokens.empty()) return out;
  out += '[';
  for (size_t l = 0; l < unit.head_tokens.size(); ++l) {
    const std::vector<int64_t>& layer = unit.head_tokens[l];
    if (layer.empty() || layer.size() != unit.head_tokens[0].size()) {
      throw std::invalid_argument(one_line(path) + ": unit " + one_line(unit.key) +
                                  ": head_tokens needs the same number of heads (at least one) "
                                  "in every layer");
    }
    out += l ? ",[" : "[";
    for (size_t h = 0; h < layer.size(); ++h) {
      if (h) out += ',';
      out += std::to_string(layer[h]);
    }
    out += ']';
  }
  out += ']';
  return out;
}

// The inverse of encode_head_tokens (whitespace allowed, as SQL's json() may leave it);
// nullopt for text that is not an array of equal-length arrays of integers.
std::optional<std::vector<std::vector<int64_t>>> decode_head_tokens(const std::string& text) {
  std::vector<std::vector<int64_t>> out;
  size_t i = 0;
  const auto skip = [&] {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  };
  const auto eat = [&](char c) {
    skip();
    if (i < text.size() && text[i] == c) {
      ++i;
      return true;
    }
    return false;
  };
  skip();
  if (i == text.size()) return out;  // "": not recorded
  if (!eat('[')) return std::nullopt;
  do {
    if (!eat('[')) return std::nullopt;
    std::vector<int64_t> layer;
    do {
      skip();
      const size_t start = i;
      if (i < text.size() && text[i] == '-') ++i;
      while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
      errno = 0;
      char* end = nullptr;
      const std::string digits = text.substr(start, i - start);
      const long long v = std::strtoll(digits.c_str(), &end, 10);
      if (digits.empty() || digits == "-" || errno == ERANGE || *end != '\0') return std::nullopt;
      layer.push_back(v);
    } while (eat(','));
    if (!eat(']')) return std::nullopt;
    if (!out.empty() && layer.size() != out[0].size()) return std::nullopt;
    out.push_back(std::move(layer));
  } while (eat(','));
  if (!eat(']')) return std::nullopt;
  skip();
  if (i != text.size()) return std::nullopt;
  return out;
}

// Inserts the unit and its turns; the caller holds the transaction. `finished_at` empty:
// now.
void insert_unit(sqlite3* db, const std::string& path, const Stmt::OnError& on_error,
                 int64_t run_id, const UnitRecord& unit, const std::string& finished_at) {
  check_real(path, unit, 0, "context_prefill_ms", unit.context_prefill_ms);
  check_real(path, unit, 0, "turn_gap_s", unit.turn_gap_s);
  check_real(path, unit, 0, "wall_ms", unit.wall_ms);
  check_real(path, unit, 0, "shared_forward_ms", unit.shared_forward_ms);
  check_real(path, unit, 0, "reference_ms", unit.reference_ms);
  for (const TurnRow& t : unit.turns) {
    check_real(path, unit, t.turn, "attn_flops", t.attn_flops);
    check_real(path, unit, t.turn, "attn_flops_dense", t.attn_flops_dense);
    check_real(path, unit, t.turn, "ttft_ms", t.ttft_ms);
    check_real(path, unit, t.turn, "tpot_ms", t.tpot_ms);
    check_real(path, unit, t.turn, "prefill_tokens_per_s", t.prefill_tokens_per_s);
    check_real(path, unit, t.turn, "decode_tokens_per_s", t.decode_tokens_per_s);
    check_real(path, unit, t.turn, "tokens_kept", t.tokens_kept);
  }
  const std::string head_tokens = encode_head_tokens(path, unit);
  {
    Stmt exists(db, "SELECT 1 FROM units WHERE unit_key = ?1", on_error);
    exists.bind(1, unit.key);
    if (exists.step()) {
      throw std::logic_error(one_line(path) + ": unit " + one_line(unit.key) +
                             " is already in the results db");
    }
  }
  const auto seed = static_cast<int64_t>(unit.seed);  // two's complement: round-trips
  Stmt u(db,
         "INSERT INTO units (run_id, unit_key, task, sample_id, method, budget, mode, seed, "
         "context_tokens, context_prefill_ms, finished_at, prefill, shared_prefill, "
         "prefilled_tokens, head_tokens, head_tokens_seen, query_setting, turn_gap_s, wall_ms, "
         "shared_forward_ms, reference_ms, method_family, method_series, budget_tokens) "
         "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, "
         "?18, ?19, ?20, ?21, ?22, ?23, ?24)",
         on_error);
  u.bind(1, run_id)
      .bind(2, unit.key)
      .bind(3, unit.task)
      .bind(4, unit.sample_id)
      .bind(5, unit.method)
      .bind(6, unit.budget)
      .bind(7, unit.mode)
      .bind(8, seed)
      .bind(9, unit.context_tokens)
      .bind(10, unit.context_prefill_ms)
      .bind(11, finished_at.empty() ? now_utc() : finished_at)
      .bind(12, unit.prefill)
      .bind(13, static_cast<int64_t>(unit.shared_prefill))
      .bind(14, unit.prefilled_tokens)
      .bind(15, head_tokens)
      .bind(16, unit.head_tokens_seen)
      .bind(17, unit.query_setting)
      .bind(18, unit.turn_gap_s)
      .bind(19, unit.wall_ms)
      .bind(20, unit.shared_forward_ms)
      .bind(21, unit.reference_ms);
  const MethodParts parts = stored_method_parts(unit.method);
  u.bind(22, parts.family).bind(23, parts.series).bind(24, parts.budget_tokens);
  u.run();
  const int64_t unit_id = sqlite3_last_insert_rowid(db);

  Stmt r(db,
         "INSERT INTO results (unit_id, run_id, task, sample_id, turn, method, budget, mode, "
         "seed, query, prediction, reference, stop_reason, prompt_tokens, output_tokens, "
         "appended_tokens, ttft_ms, tpot_ms, prefill_tokens_per_s, decode_tokens_per_s, "
         "kv_bytes, kv_bytes_peak, tokens_kept, tokens_seen, tokens_evicted, hits, misses, "
         "bytes_moved, first_token_kl, top1_agreement, score, kv_read_per_step, tokens_reused, "
         "reuse_bytes_loaded, reuse_load_ms, reuse_tiers, reuse_faults, attn_flops, "
         "attn_flops_dense, retrieval_recall) "
         "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, "
         "?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33, ?34, "
         "?35, ?36, ?37, ?38, ?39, ?40)",
         on_error);
  for (const TurnRow& t : unit.turns) {
    r.reset();
    r.bind(1, unit_id)
        .bind(2, run_id)
        .bind(3, unit.task)
        .bind(4, unit.sample_id)
        .bind(5, static_cast<int64_t>(t.turn))
        .bind(6, unit.method)
        .bind(7, unit.budget)
        .bind(8, unit.mode)
        .bind(9, seed)
        .bind(10, t.query)
        .bind(11, t.prediction)
        .bind(12, t.reference)
        .bind(13, t.stop_reason)
        .bind(14, t.prompt_tokens)
        .bind(15, t.output_tokens)
        .bind(16, t.appended_tokens)
        .bind(17, t.ttft_ms)
        .bind(18, t.tpot_ms)
        .bind(19, t.prefill_tokens_per_s)
        .bind(20, t.decode_tokens_per_s)
        .bind(21, t.kv_bytes)
        .bind(22, t.kv_bytes_peak)
        .bind(23, t.tokens_kept)
        .bind(24, t.tokens_seen)
        .bind(25, t.tokens_evicted)
        .bind(26, t.hits)
        .bind(27, t.misses)
        .bind(28, t.bytes_moved)
        .bind(29, t.first_token_kl)
        .bind(30, t.top1_agreement)
        .bind(31, t.score)
        .bind(32, t.kv_read_per_step)
        .bind(33, t.tokens_reused)
        .bind(34, t.reuse_bytes_loaded)
        .bind(35, t.reuse_load_ms)
        .bind(36, t.reuse_tiers)
        .bind(37, t.reuse_faults)
        .bind(38, t.attn_flops)
        .bind(39, t.attn_flops_dense)
        .bind(40, t.retrieval_recall);
    r.run();
  }
}

// The ranges a stored value may take (CheckedRow): wide enough for any real run, narrow
// enough that nothing sized or summed from them overflows.
constexpr int64_t kMaxContextTokens = int64_t{1} << 31;
constexpr int64_t kMaxTurns = 100000;
constexpr size_t kMaxHeadCells = size_t{1} << 16;  // a 70B model has 80 x 8
constexpr size_t kMaxHeadTokensText = size_t{1} << 20;
constexpr double kMaxMs = 1e12;    // 30 years
constexpr double kMaxRate = 1e12;  // tokens per second
constexpr double kMaxKl = 1e6;
constexpr double kMaxFlops = 1e30;

// A unit key as an error message shows it: one line, and at most 120 bytes (a key holds the
// method spec, which a hostile db can make megabytes long).
std::string shown_key(const std::string& key) {
  const std::string line = one_line(key);
  return line.size() <= 120 ? line : line.substr(0, 117) + "...";
}

// What makes a unit itself, whatever its key: the same unit under two keys would count
// twice in every mean.
std::string unit_identity(const UnitRecord& u) {
  std::string id;
  for (const std::string* part : {&u.task, &u.sample_id, &u.method, &u.budget, &u.mode,
                                  &u.query_setting}) {
    id += std::to_string(part->size()) + ":" + *part;  // length-prefixed: no separator clash
  }
  char numbers[64];
  std::snprintf(numbers, sizeof numbers, "%llu/%.17g", static_cast<unsigned long long>(u.seed),
                u.turn_gap_s);
  return id + numbers;
}

struct StoredUnit {
  UnitRecord unit;
  std::string finished_at;
};

std::vector<StoredUnit> read_units(sqlite3* db, const std::string& path,
                                   const Stmt::OnError& on_error) {
  std::vector<StoredUnit> units;
  std::map<int64_t, size_t> index_of;  // units.id -> position
  std::map<std::string, std::string> key_of;  // a unit's identity -> its key
  {
    Stmt s(db,
           "SELECT id, run_id, unit_key, task, sample_id, method, budget, mode, seed, "
           "context_tokens, context_prefill_ms, finished_at, prefill, shared_prefill, "
           "prefilled_tokens, head_tokens, head_tokens_seen, query_setting, turn_gap_s, wall_ms, "
           "shared_forward_ms, reference_ms, method_family, method_series, budget_tokens "
           "FROM units ORDER BY id",
           on_error);
    while (s.step()) {
      const CheckedRow row(s, path, "units");
      StoredUnit su;
      UnitRecord& u = su.unit;
      u.run_id = row.integer(1, "run_id", 1, CheckedRow::kMaxCount);
      u.key = row.text(2, "unit_key");
      u.task = row.label(3, "task");
      u.sample_id = row.label(4, "sample_id");
      u.method = row.label(5, "method");
      u.budget = row.label(6, "budget");
      u.mode = row.label(7, "mode");
      // Stored as the int64 of the same bits: every integer is a seed.
      u.seed = static_cast<uint64_t>(
          row.integer(8, "seed", std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max()));
      u.context_tokens = row.integer(9, "context_tokens", 0, kMaxContextTokens);
      u.context_prefill_ms = row.real(10, "context_prefill_ms", 0, kMaxMs);
      su.finished_at = row.text(11, "finished_at");
      u.prefill = row.text(12, "prefill");
      u.shared_prefill = row.integer(13, "shared_prefill", 0, 1) != 0;
      u.prefilled_tokens = row.count(14, "prefilled_tokens");
      auto head_tokens = decode_head_tokens(row.text(15, "head_tokens", kMaxHeadTokensText));
      if (!head_tokens) {
        row.fail("head_tokens", "not an array of equal-length arrays of integers");
      }
      if (!head_tokens->empty() &&
          head_tokens->size() * head_tokens->front().size() > kMaxHeadCells) {
        row.fail("head_tokens", "more than " + std::to_string(kMaxHeadCells) +
                                    " layer x head cells (the report draws one each)");
      }
      for (const auto& layer : *head_tokens) {
        for (const int64_t n : layer) {
          if (n < 0 || n > CheckedRow::kMaxCount) row.fail("head_tokens", "a count out of range");
        }
      }
      u.head_tokens = std::move(*head_tokens);
      u.head_tokens_seen = row.count(16, "head_tokens_seen");
      u.query_setting = row.label(17, "query_setting");
      u.turn_gap_s = row.real(18, "turn_gap_s", 0, kMaxMs);
      u.wall_ms = row.real(19, "wall_ms", 0, kMaxMs);
      u.shared_forward_ms = row.real(20, "shared_forward_ms", 0, kMaxMs);
      u.reference_ms = row.real(21, "reference_ms", 0, kMaxMs);
      u.parts.family = row.label(22, "method_family");
      u.parts.series = row.label(23, "method_series");
      u.parts.budget_tokens = row.opt_integer(24, "budget_tokens", 0, CheckedRow::kMaxCount);
      // The same unit under a second key would count twice in every mean.
      const auto [first, inserted] = key_of.emplace(unit_identity(u), u.key);
      if (!inserted) {
        row.fail("unit_key", "unit " + shown_key(u.key) + " repeats unit " +
                                 shown_key(first->second) +
                                 " (the same task, sample, method, budget, mode and seed)");
      }
      index_of[row.row_id()] = units.size();
      units.push_back(std::move(su));
    }
  }
  Stmt s(db,
         "SELECT id, unit_id, turn, query, prediction, reference, stop_reason, prompt_tokens, "
         "output_tokens, appended_tokens, ttft_ms, tpot_ms, prefill_tokens_per_s, "
         "decode_tokens_per_s, kv_bytes, kv_bytes_peak, tokens_kept, tokens_seen, "
         "tokens_evicted, hits, misses, bytes_moved, first_token_kl, top1_agreement, score, "
         "kv_read_per_step, tokens_reused, reuse_bytes_loaded, reuse_load_ms, reuse_tiers, "
         "reuse_faults, attn_flops, attn_flops_dense, retrieval_recall FROM results "
         "ORDER BY unit_id, turn",
         on_error);
  while (s.step()) {
    const CheckedRow row(s, path, "results");
    const auto it = index_of.find(row.integer(1, "unit_id", 1, CheckedRow::kMaxCount));
    if (it == index_of.end()) row.fail("unit_id", "names no unit");
    std::vector<TurnRow>& turns = units[it->second].unit.turns;
    TurnRow t;
    t.turn = static_cast<int32_t>(row.integer(2, "turn", 1, kMaxTurns));
    if (!turns.empty() && turns.back().turn == t.turn) {
      row.fail("turn", "turn " + std::to_string(t.turn) + " of its unit twice");
    }
    // A unit's turns are 1, 2, ... as a session runs them: a forged turn far past them
    // would size the report by it.
    if (t.turn != static_cast<int32_t>(turns.size()) + 1) {
      row.fail("turn", "turn " + std::to_string(t.turn) + " follows " +
                           std::to_string(turns.size()) + " turns of its unit");
    }
    t.query = row.text(3, "query");
    t.prediction = row.text(4, "prediction");
    t.reference = row.text(5, "reference");
    t.stop_reason = row.text(6, "stop_reason");
    t.prompt_tokens = row.count(7, "prompt_tokens");
    t.output_tokens = row.count(8, "output_tokens");
    t.appended_tokens = row.count(9, "appended_tokens");
    t.ttft_ms = row.real(10, "ttft_ms", 0, kMaxMs);
    t.tpot_ms = row.real(11, "tpot_ms", 0, kMaxMs);
    t.prefill_tokens_per_s = row.real(12, "prefill_tokens_per_s", 0, kMaxRate);
    t.decode_tokens_per_s = row.real(13, "decode_tokens_per_s", 0, kMaxRate);
    t.kv_bytes = row.count(14, "kv_bytes");
    t.kv_bytes_peak = row.count(15, "kv_bytes_peak");
    t.tokens_kept = row.real(16, "tokens_kept", 0, static_cast<double>(CheckedRow::kMaxCount));
    t.tokens_seen = row.count(17, "tokens_seen");
    t.tokens_evicted = row.count(18, "tokens_evicted");
    t.hits = row.count(19, "hits");
    t.misses = row.count(20, "misses");
    t.bytes_moved = row.count(21, "bytes_moved");
    t.first_token_kl = row.opt_real(22, "first_token_kl", -1, kMaxKl);  // rounding: a hair below 0
    t.top1_agreement = row.opt_real(23, "top1_agreement", 0, 1);
    t.score = row.opt_real(24, "score", 0, 1);
    t.kv_read_per_step = row.count(25, "kv_read_per_step");
    t.tokens_reused = row.count(26, "tokens_reused");
    t.reuse_bytes_loaded = row.count(27, "reuse_bytes_loaded");
    t.reuse_load_ms = row.real(28, "reuse_load_ms", 0, kMaxMs);
    t.reuse_tiers = row.text(29, "reuse_tiers");
    t.reuse_faults = row.text(30, "reuse_faults");
    t.attn_flops = row.real(31, "attn_flops", 0, kMaxFlops);
    t.attn_flops_dense = row.real(32, "attn_flops_dense", 0, kMaxFlops);
    t.retrieval_recall = row.opt_real(33, "retrieval_recall", 0, 1);
    turns.push_back(std::move(t));
  }
  for (const StoredUnit& su : units) {
    if (su.unit.turns.empty()) {
      throw InputError(one_line(path) + ": unit " + shown_key(su.unit.key) +
                       " has no turns (kvbench writes a unit with its turns, in one transaction)");
    }
  }
  return units;
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 || errno != ENOENT;
}

}  // namespace

// -----------------------------------------------------------------------------------------
// ResultsDb

ResultsDb::ResultsDb(std::string path) : path_(std::move(path)) {}

ResultsDb::~ResultsDb() {
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

std::unique_ptr<ResultsDb> ResultsDb::open(const std::string& path, bool read_only) {
  DbPtr db = open_connection(path, read_only);
  std::unique_ptr<ResultsDb> out(new ResultsDb(path));
  out->db_ = db.release();
  return out;
}

int64_t ResultsDb::begin_run(const RunRecord& run) {
  const auto on_error = db_errors(path_, db_);
  RunRecord r = run;
  r.started_at = now_utc();
  r.finished_at.clear();
  insert_run(db_, on_error, r, std::nullopt);
  return sqlite3_last_insert_rowid(db_);
}

void ResultsDb::finish_run(int64_t run_id) {
  const auto on_error = db_errors(path_, db_);
  Stmt s(db_, "UPDATE runs SET finished_at = ?1 WHERE id = ?2", on_error);
  s.bind(1, now_utc()).bind(2, run_id);
  s.run();
  if (sqlite3_changes(db_) != 1) {
    throw std::logic_error(one_line(path_) + ": no run " + std::to_string(run_id) +
                           " in the results db");
  }
}

std::vector<RunRecord> ResultsDb::runs() const {
  return read_runs(db_, path_, db_errors(path_, db_));
}

std::set<std::string> ResultsDb::finished_unit_keys() const {
  return read_unit_keys(db_, db_errors(path_, db_));
}

int64_t ResultsDb::forget_methods(const std::set<std::string>& methods,
                                  const std::string& config_json) {
  const auto on_error = db_errors(path_, db_);
  Transaction tx(db_, on_error);
  int64_t deleted = 0;
  for (const std::string& method : methods) {
    Stmt turns(db_, "DELETE FROM results WHERE unit_id IN (SELECT id FROM units WHERE method = ?1)",
               on_error);
    turns.bind(1, method);
    turns.run();
    Stmt units(db_, "DELETE FROM units WHERE method = ?1", on_error);
    units.bind(1, method);
    units.run();
    deleted += sqlite3_changes(db_);
  }
  Stmt runs(db_, "UPDATE runs SET config_json = ?1", on_error);
  runs.bind(1, config_json);
  runs.run();
  tx.commit();
  return deleted;
}

void ResultsDb::write_unit(int64_t run_id, const UnitRecord& unit) {
  const auto on_error = db_errors(path_, db_);
  Transaction tx(db_, on_error);
  insert_unit(db_, path_, on_error, run_id, unit, std::string());
  tx.commit();
}

std::vector<UnitRecord> ResultsDb::units() const {
  std::vector<UnitRecord> out;
  for (StoredUnit& su : read_units(db_, path_, db_errors(path_, db_))) out.push_back(std::move(su.unit));
  return out;
}

namespace {

void insert_serving(sqlite3* db, const Stmt::OnError& on_error, int64_t run_id,
                    const ServingRow& r) {
  Stmt s(db,
         "INSERT INTO serving (run_id, label, endpoint, method, concurrency, pool_bytes, task, "
         "sample_id, turn, start_s, ttft_ms, itl_ms, e2e_ms, prompt_tokens, output_tokens, "
         "cached_tokens, prediction, reference, score, error) VALUES (?1, ?2, ?3, ?4, ?5, ?6, "
         "?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
         on_error);
  s.bind(1, run_id).bind(2, r.label).bind(3, r.endpoint).bind(4, r.method)
      .bind(5, static_cast<int64_t>(r.concurrency)).bind(6, r.pool_bytes).bind(7, r.task)
      .bind(8, r.sample_id).bind(9, static_cast<int64_t>(r.turn)).bind(10, r.start_s)
      .bind(11, r.ttft_ms).bind(12, r.itl_ms).bind(13, r.e2e_ms).bind(14, r.prompt_tokens)
      .bind(15, r.output_tokens).bind(16, r.cached_tokens).bind(17, r.prediction)
      .bind(18, r.reference).bind(19, r.score).bind(20, r.error);
  s.run();
}

std::vector<ServingRow> read_serving(sqlite3* db, const Stmt::OnError& on_error) {
  Stmt s(db,
         "SELECT run_id, label, endpoint, method, concurrency, pool_bytes, task, sample_id, "
         "turn, start_s, ttft_ms, itl_ms, e2e_ms, prompt_tokens, output_tokens, cached_tokens, "
         "prediction, reference, score, error FROM serving ORDER BY id",
         on_error);
  std::vector<ServingRow> rows;
  while (s.step()) {
    ServingRow r;
    r.run_id = s.int64(0);
    r.label = s.text(1);
    r.endpoint = s.text(2);
    r.method = s.text(3);
    r.concurrency = static_cast<int32_t>(s.int64(4));
    r.pool_bytes = s.int64(5);
    r.task = s.text(6);
    r.sample_id = s.text(7);
    r.turn = static_cast<int32_t>(s.int64(8));
    r.start_s = s.real(9);
    r.ttft_ms = s.real(10);
    r.itl_ms = s.real(11);
    r.e2e_ms = s.real(12);
    r.prompt_tokens = s.int64(13);
    r.output_tokens = s.int64(14);
    r.cached_tokens = s.int64(15);
    r.prediction = s.text(16);
    r.reference = s.text(17);
    r.score = s.opt_real(18);
    r.error = s.text(19);
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace

void ResultsDb::write_serving(int64_t run_id, const std::vector<ServingRow>& rows) {
  const auto on_error = db_errors(path_, db_);
  Transaction tx(db_, on_error);
  for (const ServingRow& r : rows) insert_serving(db_, on_error, run_id, r);
  tx.commit();
}

std::vector<ServingRow> ResultsDb::serving_rows() const {
  return read_serving(db_, db_errors(path_, db_));
}

// -----------------------------------------------------------------------------------------
// merge

void merge_results(const std::vector<std::string>& inputs, const std::string& output,
                   bool allow_mixed_commits) {
  if (inputs.empty()) throw InputError(one_line(output) + ": merge needs at least one input db");
  if (path_exists(output)) {
    struct stat st {};
    if (lstat(output.c_str(), &st) != 0) {  // not there, but not a usable name either
      throw InputError(one_line(output) + ": cannot write the merged db there (" +
                       std::strerror(errno) + ")");
    }
    throw InputError(one_line(output) + ": exists; merge writes a new db");
  }

  // Every input read and checked before anything is written.
  struct Input {
    std::string path;
    std::vector<RunRecord> runs;
    std::vector<StoredUnit> units;
    std::vector<ServingRow> serving;
  };
  std::vector<Input> in;
  std::optional<RunRecord> first;  // the first run of all inputs: the others must match it
  std::string first_path;
  std::map<std::string, std::string> key_owner;  // unit key -> input path
  std::map<std::string, std::string> unit_owner;  // unit identity -> input path
  for (const std::string& path : inputs) {
    const DbPtr db = open_connection(path, /*read_only=*/true);
    const auto on_error = db_errors(path, db.get());
    Input input{path, read_runs(db.get(), path, on_error), read_units(db.get(), path, on_error),
                read_serving(db.get(), on_error)};
    for (const RunRecord& run : input.runs) {
      if (!first) {
        first = run;
        first_path = path;
        continue;
      }
      const std::string config_difference =
          run_config_difference(first->config_json, run.config_json);
      const bool config_differs = !config_difference.empty();
      const bool model_differs = run.model_sha256 != first->model_sha256;
      if (config_differs || model_differs) {
        const std::string config_what = config_difference == "config"
                                            ? "config (config_json)"
                                            : config_difference;
        const std::string what = config_differs && model_differs
                                     ? config_what + " and model (model_sha256) differ"
                                 : config_differs ? config_what + " differs"
                                                  : "model (model_sha256) differs";
        throw InputError(one_line(path) + ": run " + std::to_string(run.id) + "'s " + what +
                         " from " + one_line(first_path) + "'s run " +
                         std::to_string(first->id) + "; merge joins shards of one sweep only");
      }
    }
    for (const StoredUnit& su : input.units) {
      const UnitRecord& u = su.unit;
      const auto [it, inserted] = key_owner.emplace(u.key, path);
      if (!inserted) {
        throw InputError(one_line(path) + ": unit " + shown_key(u.key) + " is also in " +
                         one_line(it->second) + "; merge needs disjoint shards");
      }
      const auto [same, fresh] = unit_owner.emplace(unit_identity(u), path);
      if (!fresh) {
        throw InputError(one_line(path) + ": unit " + shown_key(u.key) + " repeats a unit of " +
                         one_line(same->second) + " under another key; merge needs disjoint "
                         "shards");
      }
      if (std::none_of(input.runs.begin(), input.runs.end(),
                       [&u](const RunRecord& r) { return r.id == u.run_id; })) {
        throw InputError(one_line(path) + ": unit " + shown_key(u.key) + " names run " +
                         std::to_string(u.run_id) + ", which is not in the db");
      }
    }
    for (const ServingRow& row : input.serving) {
      if (std::none_of(input.runs.begin(), input.runs.end(),
                       [&row](const RunRecord& r) { return r.id == row.run_id; })) {
        throw InputError(one_line(path) + ": a serving row names run " +
                         std::to_string(row.run_id) + ", which is not in the db");
      }
    }
    in.push_back(std::move(input));
  }
  // One code: the commits of the runs that hold units (a resume with nothing left to run
  // records an empty run, whatever its commit).
  if (!allow_mixed_commits) {
    std::optional<std::pair<std::string, std::string>> first_commit;  // (git_sha, path)
    for (const Input& input : in) {
      for (const RunRecord& run : input.runs) {
        if (run.units == 0) continue;
        if (!first_commit) {
          first_commit.emplace(run.git_sha, input.path);
        } else if (run.git_sha != first_commit->first) {
          throw InputError(one_line(input.path) + ": run " + std::to_string(run.id) +
                           " was made by commit " + one_line(run.git_sha) + ", " +
                           one_line(first_commit->second) + "'s by " +
                           one_line(first_commit->first) + "; merge joins one commit's shards "
                           "(--allow-mixed-commits merges them, and the report lists them)");
        }
      }
    }
  }

  // Written under another name and renamed when whole: a merge killed midway leaves no db
  // at `output` to block the next one (a stale partial file is replaced).
  const std::string partial = output + ".partial";
  // The partial file is removed first: it must not be one of the inputs (`merge p.db.partial
  // -o p.db` removed its own input).
  check_output_file(partial, inputs, "-o");
  const auto remove_partial = [&partial] {
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
      std::remove((partial + suffix).c_str());
    }
  };
  remove_partial();
  try {
    {
      DbPtr out = open_connection(partial, /*read_only=*/false);
      const auto on_error = db_errors(output, out.get());
      Transaction tx(out.get(), on_error);
      for (const Input& input : in) {
        std::map<int64_t, int64_t> run_ids;  // input run id -> output run id
        for (const RunRecord& run : input.runs) {
          insert_run(out.get(), on_error, run, std::nullopt);
          run_ids[run.id] = sqlite3_last_insert_rowid(out.get());
        }
        for (const ServingRow& row : input.serving) {
          insert_serving(out.get(), on_error, run_ids.at(row.run_id), row);
        }
        for (const StoredUnit& su : input.units) {
          insert_unit(out.get(), output, on_error, run_ids.at(su.unit.run_id), su.unit,
                      su.finished_at);
        }
      }
      tx.commit();
      exec(out.get(), "PRAGMA wal_checkpoint(TRUNCATE)", on_error);
    }
    if (std::rename(partial.c_str(), output.c_str()) != 0) {
      throw InputError(one_line(output) + ": cannot write the merged db (" +
                       std::strerror(errno) + ")");
    }
    remove_partial();  // the emptied -wal and -shm of the partial name
  } catch (...) {
    remove_partial();
    throw;
  }
}

}  // namespace kvbench
