// One shared-context sample in SCBench's JSONL schema:
// {"id": ..., "context": "...", "multi_turns": [{"input": "...", "answer": "..." or [...],
//  "options"?: [...], "task"?: "...", "reference"?: "..."}], "lang"?: "...", "repo"?: "...",
//  "documents"?: ["...", ...], "task"?: "..."} ("documents", the sample's "task" and a turn's
//  "reference" are kvbench's, not SCBench's: what `kvbench list tasks --export` writes)
#pragma once

#include <istream>
#include <string>
#include <vector>

namespace kvbench {

struct SampleTurn {
  std::string input;                 // the query of this turn, as the model sees it
  std::vector<std::string> answers;  // accepted answers; for a contains_all task (variable
                                     // tracking) every one of them is required
  std::string reference;  // the gold answer the session teacher-forces and, multi-turn,
                          // appends; empty: answers[0]
  std::vector<std::string> options;  // multiple-choice option texts, labels A, B, C, ...
  std::string task;  // the task this turn belongs to, when it differs from the sample's
                     // (a part of a mix task; SCBench's per-turn "task")
};

struct Sample {
  std::string id;
  std::string task;     // the task that generated or formats it; empty for a plain file
  std::string context;  // the shared context, as the model sees it
  // When non-empty, the context is these documents joined with "\n\n", each a chunk that
  // CacheBlend (harness/cache_blend.h) may cache separately (docs_kv; a JSONL "documents").
  std::vector<std::string> documents;
  std::vector<SampleTurn> turns;
  std::string lang;  // SCBench's optional "lang" (e.g. "python" for RepoQA)
  std::string repo;  // SCBench's optional "repo"
};

// The text a turn's gold answer is fed as: `reference`, else answers[0], else "".
inline const std::string& gold_text(const SampleTurn& turn) {
  static const std::string empty;
  if (!turn.reference.empty()) return turn.reference;
  return turn.answers.empty() ? empty : turn.answers[0];
}

// The task that scores a turn: its own, else the sample's.
inline const std::string& turn_task(const Sample& sample, const SampleTurn& turn) {
  return turn.task.empty() ? sample.task : turn.task;
}

// The no-context control: the same samples with the context (and its documents) removed,
// so every turn's question is asked alone. A task whose answers the model gives without
// the context cannot measure what a cache method lost.
inline std::vector<Sample> without_context(std::vector<Sample> samples) {
  for (Sample& sample : samples) {
    sample.context.clear();
    sample.documents.clear();
  }
  return samples;
}

// Reads a JSONL file of samples. Throws InputError naming the file and line for a missing
// file, malformed JSON, a missing or mistyped field, documents that do not join to the
// context, or an empty file. Ids may be numbers or strings (kept as text); options, a
// turn's task and reference, lang, repo, documents and the sample's task are optional;
// other fields are ignored. The samples are raw: no task template applied (see
// tasks/task_catalog.h, format_scbench_sample).
std::vector<Sample> load_samples_jsonl(const std::string& path);
// The same from a stream; `path` names it in errors.
std::vector<Sample> parse_samples_jsonl(std::istream& in, const std::string& path);

// One sample as one JSONL line (no newline), every field the loader reads and only the
// ones set: parse_samples_jsonl of it gives the sample back, text for text.
std::string sample_jsonl_line(const Sample& sample);

}  // namespace kvbench
