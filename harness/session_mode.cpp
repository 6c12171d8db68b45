#include "harness/session_mode.h"

#include "cache/registry.h"
#include "common/input_error.h"

namespace kvbench {

const char* to_string(SessionMode mode) {
  return mode == SessionMode::MultiTurn ? "multi-turn" : "multi-request";
}

SessionMode parse_session_mode(const std::string& text) {
  if (text == "multi-turn") return SessionMode::MultiTurn;
  if (text == "multi-request") return SessionMode::MultiRequest;
  throw InputError("unknown session mode '" + text + "' (expected multi-turn or multi-request)");
}

const char* to_string(AnswerSource source) {
  return source == AnswerSource::Gold ? "gold" : "model";
}

AnswerSource parse_answer_source(const std::string& text) {
  if (text == "gold") return AnswerSource::Gold;
  if (text == "model") return AnswerSource::Model;
  throw InputError("unknown answer source '" + text + "' (expected gold or model)");
}

const char* to_string(QuerySetting setting) {
  return setting == QuerySetting::Agnostic ? "agnostic" : "aware";
}

QuerySetting parse_query_setting(const std::string& text) {
  if (text == "agnostic") return QuerySetting::Agnostic;
  if (text == "aware") return QuerySetting::Aware;
  throw InputError("unknown query setting '" + text + "' (expected agnostic or aware)");
}

void check_query_setting(const ResolvedSpec& spec, QuerySetting setting) {
  if (setting != QuerySetting::Aware) return;
  const MethodParams* reuse = spec.find(MethodKind::Reuse);
  if (!reuse) return;
  for (const auto& [info, params] : spec.components) {
    if (info->name == "cacheblend") {
      throw InputError("query setting aware: '" + spec.canonical + "' blends the documents' "
                       "cached KV before any query; run cacheblend agnostic");
    }
  }
  if (spec.find(MethodKind::Eviction)) {
    throw InputError("query setting aware: '" + spec.canonical + "' reuses a context "
                     "compressed once across requests, which an aware compression (one per "
                     "query) cannot be; run it agnostic, or without prefix");
  }
}

}  // namespace kvbench
