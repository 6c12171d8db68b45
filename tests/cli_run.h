// Running the kvbench binary from a test: its exit code and output, and the shape every
// bad input must give (one line, exit 2, naming the input). Shared by the CLI test files.
#pragma once

#include <catch2/catch.hpp>

#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gguf_writer.h"
#include "store/results_db.h"

namespace kvbench::testing {

struct Run {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// A shell command's exit code and output (stdout and stderr together).
inline Run run_command(const std::string& command) {
  Run run;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

// `args` go through the shell after the binary's path; `prefix` before it (an environment
// assignment, `ulimit -f 1;`).
inline Run run_kvbench(const std::string& args, const std::string& prefix = "") {
  return run_command(prefix + " " + std::string(KVBENCH_BINARY) + " " + args);
}

inline int count_lines(const std::string& text) {
  int lines = 0;
  for (char c : text) lines += c == '\n';
  return lines;
}

// One line, exit 2, mentioning `needle`.
inline void require_clear_error(const Run& run, const std::string& needle) {
  INFO(run.output);
  CHECK(run.exit_code == 2);
  CHECK(count_lines(run.output) == 1);
  CHECK(run.output.rfind("kvbench: error: ", 0) == 0);
  CHECK(run.output.find(needle) != std::string::npos);
}

inline std::string write_text(const std::string& name, const std::string& text) {
  const std::string path = temp_path(name);
  write_file(path, std::vector<uint8_t>(text.begin(), text.end()));
  return path;
}

// A db of one finished unit, written through the results API.
inline std::string one_unit_db(const std::string& name, const std::string& method) {
  const std::string path = temp_path(name);
  std::remove(path.c_str());
  auto db = ResultsDb::open(path);
  RunRecord run;
  run.kvbench_version = "0.1.0";
  run.model_path = "m.gguf";
  run.config_json = "{}";
  const int64_t id = db->begin_run(run);
  UnitRecord unit;
  unit.task = "retr_kv";
  unit.method = method;
  unit.mode = "multi-turn";
  unit.sample_id = "s";
  unit.key = "retr_kv|s|multi-turn|" + method;
  TurnRow turn;
  turn.turn = 1;
  turn.score = 1.0;
  turn.kv_bytes = 1000;
  unit.turns = {turn};
  db->write_unit(id, unit);
  db->finish_run(id);
  return path;
}

// A file's bytes ("" when it cannot be read).
inline std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Whether anything (a symlink included, not followed) is at `path`.
inline bool path_exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

// Whether a temporary of `path` is left beside it: `path.tmp` or write_file_atomically's
// `path.tmp.XXXXXX` (common/files.h).
inline bool temporary_left(const std::string& path) {
  const std::filesystem::path p(path);
  const std::filesystem::path folder = p.parent_path().empty() ? "." : p.parent_path();
  const std::string prefix = p.filename().string() + ".tmp";
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    if (entry.path().filename().string().rfind(prefix, 0) == 0) return true;
  }
  return false;
}

// The first column of a query's first row in the db at `path` ("" for none or NULL).
inline std::string sql_text(const std::string& db, const std::string& query) {
  sqlite3* handle = nullptr;
  REQUIRE(sqlite3_open(db.c_str(), &handle) == SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  REQUIRE(sqlite3_prepare_v2(handle, query.c_str(), -1, &stmt, nullptr) == SQLITE_OK);
  std::string out;
  if (sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0) != nullptr) {
    out = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(handle);
  return out;
}

}  // namespace kvbench::testing
