// How a session feeds a sample's turns, as names in configs and on the command line
// (separate from the driver, harness/session.h, so that configs parse without the model).
#pragma once

#include <string>

namespace kvbench {

enum class SessionMode { MultiTurn, MultiRequest };
enum class AnswerSource { Gold, Model };  // what a multi-turn turn appends after decoding

const char* to_string(SessionMode mode);   // "multi-turn", "multi-request"
SessionMode parse_session_mode(const std::string& text);  // InputError on anything else
const char* to_string(AnswerSource source);               // "gold", "model"
AnswerSource parse_answer_source(const std::string& text);  // InputError on anything else

}  // namespace kvbench
