#include "tasks/task_catalog.h"

#include <algorithm>
#include <cstddef>

#include "common/input_error.h"

namespace kvbench {

namespace {

// How a turn's raw input becomes the query the model sees.
enum class Query {
  input,   // "{input}"
  choice,  // question and the four options A-D
  qa_eng,  // "Question: {question}\nAnswer:"
  qa_chn,  // "问题：{question}\n答案："
  math,    // "What is {target}?\n\n{input}"
};

struct ScbenchTemplate {
  const char* task;
  const char* context_prefix;  // the text before {context}; scbench_mf's is the first turn
  Query query;
};

// SCBench's multi-request prompts, written after MInference scbench/eval_utils.py
// (multiturn_templates_scdq for the context, multiturn_follow_up_templates_in_chat_tempate
// for the turns). Every SCBench context template is "<prefix>{context}", so only the
// prefix is kept; the chat template is the session's business, not the task's.
const ScbenchTemplate kTemplates[] = {
    {"scbench_kv",
     "Extract the value corresponding to the specified key in the JSON object below.\n\n",
     Query::input},
    {"scbench_kv_hard",
     "Extract the value corresponding to the specified key in the JSON object below.\n\n",
     Query::input},
    {"scbench_kv_compressible",
     "Extract the value corresponding to the specified key in the following passage.\n\n",
     Query::input},
    {"scbench_prefix_suffix", "", Query::input},
    {"scbench_passkey",
     "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
     "it. I will quiz you about the important information.\n\n",
     Query::input},
    {"scbench_hashhop", "", Query::input},
    {"scbench_vt", "", Query::input},
    {"scbench_repoqa",
     "Based on the function description and code context, please retrieve and repeat the "
     "exact described function from the code context in a code block wrapped by ```:\n\n",
     Query::input},
    {"scbench_qa_eng",
     "Read the book and answer the question. Be very concise in your answer.\n\n",
     Query::qa_eng},
    {"scbench_qa_chn", "阅读以下书籍然后回答问题。\n\n", Query::qa_chn},
    {"scbench_choice_eng", "Read the book and answer the question.\n\n", Query::choice},
    {"scbench_many_shot", "", Query::input},
    {"scbench_mf", nullptr, Query::math},
    {"scbench_repoqa_and_kv", "", Query::input},
};

// SCBench tasks kvbench leaves out, and why (named in the errors for them).
bool is_rouge_task(std::string_view name) {
  return name == "scbench_summary" || name == "scbench_summary_with_needles";
}

const char* kRougeNote = "; SCBench's summary tasks are not supported: they are scored by ROUGE, "
                         "which kvbench does not have";

// Tasks whose turns each belong to another task (SampleTurn::task); the mixed task's own
// scorer is never used.
bool is_mixed(std::string_view name) { return name == "mix" || name == "scbench_repoqa_and_kv"; }

// The tasks a turn of scbench_repoqa_and_kv may name.
bool is_repoqa_and_kv_part(const std::string& task) {
  return task == "scbench_kv" || task == "scbench_repoqa";
}

const ScbenchTemplate* find_template(std::string_view task) {
  for (const ScbenchTemplate& t : kTemplates) {
    if (task == t.task) return &t;
  }
  return nullptr;
}

// The names of the tasks from `only`, or of every task, comma-separated.
std::string task_names(const TaskSource* only = nullptr) {
  std::string out;
  for (const TaskFormat& f : task_formats()) {
    if (only != nullptr && f.source != *only) continue;
    out += (out.empty() ? "" : ", ") + f.name;
  }
  return out;
}

constexpr TaskSource kScbench = TaskSource::Scbench;

std::string ascii_lower(std::string text) {
  for (char& c : text) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return text;
}

// SCBench's Math.Find target: re.findall(r"The .+ is", input)[0].lower()[:-3]. The leftmost
// "The " that has a " is" after it on the same line (Python's "." stops at "\n"), with the
// greedy ".+" running to the last such " is" on that line. Lowercasing is ASCII only.
bool math_target(const std::string& input, std::string& target) {
  for (size_t start = input.find("The "); start != std::string::npos;
       start = input.find("The ", start + 1)) {
    const size_t line_end = std::min(input.find('\n', start), input.size());
    const size_t body = start + 4;  // ".+" needs at least one character before " is"
    if (body + 1 + 3 > line_end) continue;
    const size_t is = input.rfind(" is", line_end - 3);
    if (is == std::string::npos || is < body + 1) continue;
    target = ascii_lower(input.substr(start, is - start));
    return true;
  }
  return false;
}

// "scbench_kv sample '3' turn 2" for the errors about one turn (turns counted from 1, as
// the session reports them).
std::string turn_where(const std::string& task, const Sample& sample, size_t index) {
  return task + " sample '" + sample.id + "' turn " + std::to_string(index + 1);
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

}  // namespace

const std::vector<TaskFormat>& task_formats() {
  using S = Scorer;
  constexpr TaskSource gen = TaskSource::Generated;
  constexpr TaskSource scb = TaskSource::Scbench;
  // SCBench's max new tokens are DATA_NAME_TO_MAX_NEW_TOKENS in MInference
  // scbench/eval_utils.py. There scbench_repoqa_and_kv decodes 1024 for its RepoQA turns
  // and 80 for its KV turns; kvbench decodes one budget per sample, the largest over its
  // turns' tasks (max_new_tokens_for), so a KV turn of that file may decode up to 1024.
  // retr_kv: a first answer that quotes the key before the value ("The value corresponding
  // to the key "..." is "...".) takes ~80 tokens where the tokenizer splits every digit
  // (Qwen2's): 48 cut Qwen2.5 off before the value. SCBench gives its Retr.KV 150.
  // multihop_vt: RULER decodes 30 tokens after its answer prefix, which a base model
  // continues; a chat model's first answer restates the prefix (~25 of Qwen2's tokens)
  // before the names, and 30 cut Qwen2.5-1.5B off before them on every first turn.
  static const std::vector<TaskFormat> formats = {
      {"retr_kv", gen, S::contains, 96,
       "Retr.KV: JSON object of UUID pairs, the value of one key per turn"},
      {"retr_prefix_suffix", gen, S::contains, 32,
       "Retr.Prefix-Suffix: list of random strings, the one with a given prefix and suffix"},
      {"multihop_vt", gen, S::contains_all, 64,
       "Retr.MultiHop: variable-tracking chains, every variable holding a value"},
      {"math_find", gen, S::number, 16,
       "Math.Find: list of numbers, its largest, smallest, median, ..."},
      {"docs_kv", gen, S::contains, 24,
       "Documents in a shuffled order (CacheBlend's case): a fact from one of them"},
      {"niah", gen, S::contains, 32,
       "RULER multi-key NIAH over real prose: the special magic number for a key"},
      {"repoqa", gen, S::contains, 32,
       "Code.RepoQA over real Python: a function's name from its docstring"},
      {"repoqa_function", gen, S::function, 1024,
       "Code.RepoQA as SCBench asks it: repeat the described function (RepoQA similarity 0.8)"},
      {"mix", gen, S::contains, 96,
       "Two generated tasks over one context, each turn scored by its part's task"},
      {"scbench_kv", scb, S::contains, 150, "SCBench Retr.KV: value of a key in a JSON object"},
      {"scbench_kv_hard", scb, S::contains, 150, "SCBench Retr.KV, harder keys"},
      {"scbench_kv_compressible", scb, S::contains, 150,
       "SCBench Retr.KV with key-value pairs in a passage"},
      {"scbench_prefix_suffix", scb, S::contains, 150,
       "SCBench Retr.Prefix-Suffix: string with a given prefix and suffix"},
      {"scbench_passkey", scb, S::contains, 15, "SCBench passkey hidden in irrelevant text"},
      {"scbench_hashhop", scb, S::contains, 150, "SCBench HashHop: multi-hop hash chains"},
      {"scbench_vt", scb, S::contains_all, 30,
       "SCBench Retr.MultiHop: variables assigned a value (all required)"},
      {"scbench_repoqa", scb, S::code, 1024,
       "SCBench Code.RepoQA: repeat the described function from a repository"},
      {"scbench_qa_eng", scb, S::f1_en, 40, "SCBench En.QA: question on a book, token F1"},
      {"scbench_qa_chn", scb, S::f1_zh, 40, "SCBench Zh.QA: question on a Chinese book, char F1"},
      {"scbench_choice_eng", scb, S::choice, 40,
       "SCBench En.MultiChoice: question on a book with options A-D"},
      {"scbench_many_shot", scb, S::choice, 10, "SCBench ICL.ManyShot: in-context examples, a label"},
      {"scbench_mf", scb, S::number, 5, "SCBench Math.Find: a statistic of a list of numbers"},
      {"scbench_repoqa_and_kv", scb, S::contains, 1024,
       "SCBench Mix.RepoQA+KV: each turn scored by its task (scbench_repoqa or scbench_kv)"},
  };
  return formats;
}

const TaskFormat* find_task_format(std::string_view name) {
  for (const TaskFormat& f : task_formats()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

const TaskFormat* named_task(const Sample& sample, const std::string& path) {
  if (sample.task.empty()) return nullptr;
  const TaskFormat* format = find_task_format(sample.task);
  if (!format) {
    throw InputError(path + ": sample '" + sample.id + "' names an unknown task '" + sample.task +
                     "' (kvbench list tasks)");
  }
  return format;
}

const TaskFormat& task_format(const std::string& name) {
  if (const TaskFormat* f = find_task_format(name)) return *f;
  throw InputError("unknown task '" + name + "' (tasks: " + task_names() +
                   ")" + (is_rouge_task(name) ? kRougeNote : ""));
}

Sample format_scbench_sample(const std::string& task, const Sample& raw) {
  const TaskFormat* format = find_task_format(task);
  const ScbenchTemplate* tmpl = find_template(task);
  if (format == nullptr || format->source != TaskSource::Scbench || tmpl == nullptr) {
    throw InputError("task '" + task + "' is not an SCBench task (SCBench tasks: " +
                     task_names(&kScbench) + ")" +
                     (is_rouge_task(task) ? kRougeNote : ""));
  }
  const bool mixed = is_mixed(task);
  Sample out = raw;
  out.task = task;
  // SCBench's quirk: scbench_mf puts the FIRST turn's raw input in front of the context.
  if (tmpl->query == Query::math) {
    out.context = (raw.turns.empty() ? std::string() : raw.turns[0].input) + "\n\n" + raw.context;
  } else {
    out.context = tmpl->context_prefix + raw.context;
  }
  for (size_t i = 0; i < out.turns.size(); ++i) {
    SampleTurn& turn = out.turns[i];
    const std::string& raw_input = raw.turns[i].input;
    if (mixed) {
      if (!is_repoqa_and_kv_part(turn.task)) {
        throw InputError(turn_where(task, raw, i) + ": turn task '" + turn.task +
                         "' must be scbench_kv or scbench_repoqa");
      }
    } else if (!turn.task.empty() && turn.task != task) {
      throw InputError(turn_where(task, raw, i) + ": turn task '" + turn.task +
                       "' differs from the file's task");
    }
    switch (tmpl->query) {
      case Query::input:
        break;
      case Query::choice:
        if (turn.options.size() != 4) {
          throw InputError(turn_where(task, raw, i) + ": needs 4 options (A-D), has " +
                           std::to_string(turn.options.size()));
        }
        // "The the" is SCBench's own typo, kept so that prompts match SCBench's.
        turn.input = "Question: " + raw_input + "\nA. " + turn.options[0] + "\nB. " +
                     turn.options[1] + "\nC. " + turn.options[2] + "\nD. " + turn.options[3] +
                     "\n\nThe the correct answer is";
        break;
      case Query::qa_eng:
        turn.input = "Question: " + raw_input + "\nAnswer:";
        break;
      case Query::qa_chn:
        turn.input = "问题：" + raw_input + "\n答案：";
        break;
      case Query::math: {
        std::string target;
        if (!math_target(raw_input, target)) {
          throw InputError(turn_where(task, raw, i) +
                           ": the input has no \"The ... is\" naming what to find");
        }
        turn.input = "What is " + target + "?\n\n" + raw_input;
        break;
      }
    }
    // Every answer is required; the gold text the session feeds lists them all.
    const std::string& own = turn.task.empty() ? task : turn.task;
    if (task_format(own).scorer == Scorer::contains_all) turn.reference = join(turn.answers, ", ");
  }
  return out;
}

double score_turn(const Sample& sample, const SampleTurn& turn, std::string_view prediction) {
  const std::string& task = turn_task(sample, turn);
  const TaskFormat* format = find_task_format(task);
  if (format == nullptr || is_mixed(task)) {
    std::string where = "sample '" + sample.id + "'";
    const SampleTurn* first = sample.turns.data();
    if (&turn >= first && &turn < first + sample.turns.size()) {
      where += " turn " + std::to_string(&turn - first + 1);
    }
    if (task.empty()) throw InputError(where + ": no task to score the turn by");
    if (format != nullptr) {
      throw InputError(where + ": the turn has no task of its own, and the mixed task '" + task +
                       "' scores each turn by its part's task");
    }
    throw InputError(where + ": unknown task '" + task + "' (tasks: " +
                     task_names() + ")");
  }
  if (format->scorer == Scorer::choice) {
    return multiple_choice(prediction, turn.answers, turn.options);
  }
  return score(format->scorer, prediction, turn.answers);
}

int32_t max_new_tokens_for(const Sample& sample) {
  if (sample.turns.empty()) return task_format(sample.task).max_new_tokens;
  int32_t most = 0;
  for (const SampleTurn& turn : sample.turns) {
    most = std::max(most, task_format(turn_task(sample, turn)).max_new_tokens);
  }
  return most;
}

}  // namespace kvbench
