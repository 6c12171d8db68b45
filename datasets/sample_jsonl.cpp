#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "datasets/sample.h"
#include "common/files.h"
#include "common/input_error.h"
#include "common/json_input.h"

namespace kvbench {

namespace {

using nlohmann::json;

// A JSON number as text: integers without a decimal point ("42", not "42.0").
std::string number_text(const json& value) {
  if (value.is_number_integer() || value.is_number_unsigned()) return value.dump();
  const double d = value.get<double>();
  // The range first: casting a double outside long long's range is undefined.
  if (std::isfinite(d) && d > -1e15 && d < 1e15 && d == std::trunc(d)) {
    return std::to_string(static_cast<long long>(d));
  }
  return dump_json(value);
}

const char* type_name(const json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "a list";
  return "an object";
}

class LineReader {
 public:
  LineReader(std::string path, int64_t line) : where_(std::move(path) + ":" + std::to_string(line)) {}

  [[noreturn]] void fail(const std::string& what) const { throw InputError(where_ + ": " + what); }
  const std::string& where() const { return where_; }

  const json& field(const json& object, const std::string& name, const std::string& owner) const {
    const auto it = object.find(name);
    if (it == object.end()) fail(owner + "missing field '" + name + "'");
    return *it;
  }

  std::string string_field(const json& object, const std::string& name,
                           const std::string& owner) const {
    const json& value = field(object, name, owner);
    if (!value.is_string()) {
      fail(owner + "field '" + name + "' must be a string, not " + type_name(value));
    }
    return value.get<std::string>();
  }

  // An optional string field: absent or null leaves `out` empty (null, for files written
  // by tools that emit every column).
  void optional_string(const json& object, const std::string& name, const std::string& owner,
                       std::string& out) const {
    const auto it = object.find(name);
    if (it == object.end() || it->is_null()) return;
    if (!it->is_string()) {
      fail(owner + "field '" + name + "' must be a string, not " + type_name(*it));
    }
    out = it->get<std::string>();
  }

  // A turn's optional multiple-choice options: a list of strings or numbers.
  std::vector<std::string> options(const json& turn, const std::string& owner) const {
    const auto it = turn.find("options");
    if (it == turn.end() || it->is_null()) return {};
    if (!it->is_array()) {
      fail(owner + "field 'options' must be a list of strings, not " + type_name(*it));
    }
    std::vector<std::string> out;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& o = (*it)[i];
      if (o.is_string()) {
        out.push_back(o.get<std::string>());
      } else if (o.is_number()) {
        out.push_back(number_text(o));
      } else {
        fail(owner + "field 'options' item " + std::to_string(i) + " must be a string, not " +
             type_name(o));
      }
    }
    return out;
  }

  // The optional documents: a list of strings that joined with "\n\n" are the context
  // (anything else would have CacheBlend cache other text than the model is shown).
  std::vector<std::string> documents(const json& row, const std::string& context) const {
    const auto it = row.find("documents");
    if (it == row.end() || it->is_null()) return {};
    if (!it->is_array()) {
      fail(std::string("field 'documents' must be a list of strings, not ") + type_name(*it));
    }
    std::vector<std::string> out;
    std::string joined;
    for (size_t i = 0; i < it->size(); ++i) {
      const json& d = (*it)[i];
      if (!d.is_string()) {
        fail("field 'documents' item " + std::to_string(i) + " must be a string, not " +
             type_name(d));
      }
      out.push_back(d.get<std::string>());
      joined += (i ? "\n\n" : "") + out.back();
    }
    if (!out.empty() && joined != context) {
      fail("field 'documents' joined with blank lines (\"\\n\\n\") is not the context");
    }
    return out;
  }

  std::vector<std::string> answers(const json& value, const std::string& owner) const {
    if (value.is_string()) return {value.get<std::string>()};
    if (value.is_number()) return {number_text(value)};
    if (value.is_array()) {
      if (value.empty()) fail(owner + "field 'answer' is an empty list");
      std::vector<std::string> out;
      for (size_t i = 0; i < value.size(); ++i) {
        const json& a = value[i];
        if (a.is_string()) {
          out.push_back(a.get<std::string>());
        } else if (a.is_number()) {
          out.push_back(number_text(a));
        } else {
          fail(owner + "field 'answer' item " + std::to_string(i) + " must be a string, not " +
               type_name(a));
        }
      }
      return out;
    }
    fail(owner + "field 'answer' must be a string, a number or a list of strings, not " +
         type_name(value));
  }

  Sample sample(const json& row) const {
    if (!row.is_object()) fail(std::string("expected a JSON object, got ") + type_name(row));
    Sample sample;
    const json& id = field(row, "id", "");
    if (id.is_string()) {
      sample.id = id.get<std::string>();
    } else if (id.is_number()) {
      sample.id = number_text(id);
    } else {
      fail(std::string("field 'id' must be a string or a number, not ") + type_name(id));
    }
    sample.context = string_field(row, "context", "");
    optional_string(row, "lang", "", sample.lang);
    optional_string(row, "repo", "", sample.repo);
    optional_string(row, "task", "", sample.task);
    sample.documents = documents(row, sample.context);
    const json& turns = field(row, "multi_turns", "");
    if (!turns.is_array()) {
      fail(std::string("field 'multi_turns' must be a list, not ") + type_name(turns));
    }
    if (turns.empty()) fail("field 'multi_turns' is an empty list");
    for (size_t i = 0; i < turns.size(); ++i) {
      const std::string owner = "multi_turns[" + std::to_string(i) + "]: ";
      if (!turns[i].is_object()) {
        fail(owner + "expected an object with 'input' and 'answer', got " + type_name(turns[i]));
      }
      SampleTurn turn;
      turn.input = string_field(turns[i], "input", owner);
      turn.answers = answers(field(turns[i], "answer", owner), owner);
      turn.options = options(turns[i], owner);
      optional_string(turns[i], "task", owner, turn.task);
      optional_string(turns[i], "reference", owner, turn.reference);
      sample.turns.push_back(std::move(turn));
    }
    return sample;
  }

 private:
  std::string where_;
};

bool blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\n\f\v") == std::string::npos;
}

}  // namespace

std::vector<Sample> load_samples_jsonl(const std::string& path) {
  require_regular_file(path, "sample file");  // not a directory, and no FIFO to block on
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open the sample file");
  return parse_samples_jsonl(in, path);
}

std::vector<Sample> parse_samples_jsonl(std::istream& in, const std::string& path) {
  std::vector<Sample> samples;
  std::map<std::string, int64_t> first_line;  // id -> line
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line_no == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // UTF-8 BOM
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (blank(line)) continue;
    const LineReader reader(path, line_no);
    const json row = parse_json_input(line, reader.where());
    Sample sample = reader.sample(row);
    const auto [it, fresh] = first_line.emplace(sample.id, line_no);
    if (!fresh) {
      reader.fail("duplicate id '" + sample.id + "' (first on line " +
                  std::to_string(it->second) + ")");
    }
    samples.push_back(std::move(sample));
  }
  if (in.bad()) throw InputError(path + ": read error");
  if (samples.empty()) throw InputError(path + ": no samples (the file is empty)");
  return samples;
}

std::string sample_jsonl_line(const Sample& sample) {
  json row = json::object();
  row["id"] = sample.id;
  row["context"] = sample.context;
  json turns = json::array();
  for (const SampleTurn& turn : sample.turns) {
    json t = json::object();
    t["input"] = turn.input;
    if (turn.answers.size() == 1) {
      t["answer"] = turn.answers[0];
    } else {
      t["answer"] = turn.answers;
    }
    if (!turn.options.empty()) t["options"] = turn.options;
    if (!turn.task.empty()) t["task"] = turn.task;
    if (!turn.reference.empty()) t["reference"] = turn.reference;
    turns.push_back(std::move(t));
  }
  row["multi_turns"] = std::move(turns);
  if (!sample.documents.empty()) row["documents"] = sample.documents;
  if (!sample.task.empty()) row["task"] = sample.task;
  if (!sample.lang.empty()) row["lang"] = sample.lang;
  if (!sample.repo.empty()) row["repo"] = sample.repo;
  return dump_json(row);
}

}  // namespace kvbench
