// Running another program (sbatch, squeue, scancel) and reading what it printed: argv is
// passed as is, through no shell, so paths with spaces or quotes need no escaping.
#pragma once

#include <string>
#include <vector>

namespace kvbench {

struct ProcessResult {
  int exit_code = -1;  // 127: could not be started; 128 + N: killed by signal N
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs argv[0] (looked up in PATH) with argv and waits for it. Each stream is read up to
// 16 MiB; what comes beyond is dropped.
ProcessResult run_process(const std::vector<std::string>& argv);

}  // namespace kvbench
