#include "harness/session_mode.h"

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

}  // namespace kvbench
