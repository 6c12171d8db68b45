// The tasks kvbench runs and how each one is prompted, decoded and scored: the synthetic
// tasks kvbench generates (datasets/generator.h) and SCBench's task files, which a user
// with the data passes as JSONL (SCBench's templates, max new tokens and scorers, from
// MInference scbench/eval_utils.py and compute_scores.py).
// Framework-free: no model, no JSON.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "datasets/sample.h"
#include "tasks/scorers.h"

namespace kvbench {

enum class TaskSource {
  Generated,  // made by generate_samples; its context already holds the instruction
  Scbench,    // an SCBench JSONL file; format_scbench_sample applies its template
};

struct TaskFormat {
  std::string name;  // "retr_kv", "scbench_kv", ...
  TaskSource source = TaskSource::Generated;
  Scorer scorer = Scorer::contains;  // per turn; a mixed task scores each turn by the
                                     // scorer of the turn's own task
  int32_t max_new_tokens = 64;       // tokens decoded per turn
  std::string summary;               // one line for `kvbench list tasks`
};

// Every task kvbench can run, generated ones first, in a fixed order.
const std::vector<TaskFormat>& task_formats();

// nullptr when `name` is not a task.
const TaskFormat* find_task_format(std::string_view name);

// The task a sample of the file `path` names (its "task", as `kvbench list tasks --export`
// writes it); nullptr when it names none. Throws InputError naming the file and the sample
// for a task kvbench does not have.
const TaskFormat* named_task(const Sample& sample, const std::string& path);

// The task named `name`; throws InputError naming it and listing the known tasks.
const TaskFormat& task_format(const std::string& name);

// A raw sample from an SCBench file (load_samples_jsonl) as the model sees it, for the
// SCBench task `task`: the context through the task's context template, every turn's
// input through its query template (multiple choice: question and the A-D options), the
// task set on the sample, and for contains_all tasks the answers joined by ", " as the
// reference. SCBench's multi-request ("scdq") templates are used for both modes, since
// kvbench's session appends the previous answer itself. Throws InputError naming the task
// and the sample for a task that is not an SCBench one, or a turn the template cannot
// take (choice without 4 options, a math question with no "The ... is", an unknown
// per-turn task in a mixed file).
Sample format_scbench_sample(const std::string& task, const Sample& raw);

// The score in [0, 1] of one turn's prediction, by the scorer of turn_task(sample, turn)
// (multiple choice with the turn's options). Throws InputError for an unknown task.
double score_turn(const Sample& sample, const SampleTurn& turn, std::string_view prediction);

// Tokens to decode per turn for a sample: the largest max_new_tokens over its turns' tasks.
int32_t max_new_tokens_for(const Sample& sample);

}  // namespace kvbench
