// One shared-context sample in SCBench's JSONL schema:
// {"id": ..., "context": "...", "multi_turns": [{"input": "...", "answer": "..." or [...]}]}
#pragma once

#include <string>
#include <vector>

namespace kvbench {

struct SampleTurn {
  std::string input;                 // the query of this turn
  std::vector<std::string> answers;  // accepted answers; answers[0] is the reference
};

struct Sample {
  std::string id;
  std::string context;
  std::vector<SampleTurn> turns;
};

// Reads a JSONL file of samples. Throws InputError naming the file and line for a missing
// file, malformed JSON, a missing or mistyped field, or an empty file. Ids may be numbers
// or strings (kept as text); extra fields are ignored.
std::vector<Sample> load_samples_jsonl(const std::string& path);

}  // namespace kvbench
