// How a session feeds a sample's turns, as names in configs and on the command line
// (separate from the driver, harness/session.h, so that configs parse without the model).
#pragma once

#include <string>

namespace kvbench {

enum class SessionMode { MultiTurn, MultiRequest };
enum class AnswerSource { Gold, Model };  // what a multi-turn turn appends after decoding
// Where the context's compression happens: before any question (Agnostic), or after the
// first turn's query, so the query is inside the compressed span (Aware: SnapKV's window
// is the question, as kvpress's query-aware runs).
enum class QuerySetting { Agnostic, Aware };

const char* to_string(SessionMode mode);   // "multi-turn", "multi-request"
SessionMode parse_session_mode(const std::string& text);  // InputError on anything else
const char* to_string(AnswerSource source);               // "gold", "model"
AnswerSource parse_answer_source(const std::string& text);  // InputError on anything else
const char* to_string(QuerySetting setting);                // "agnostic", "aware"
QuerySetting parse_query_setting(const std::string& text);  // InputError on anything else

struct ResolvedSpec;
// InputError naming the method when `spec` cannot run under `setting`: query-aware, a
// compressed context reused whole (prefix + an eviction method) would be reused across
// different queries, and CacheBlend blends documents before any query.
void check_query_setting(const ResolvedSpec& spec, QuerySetting setting);

}  // namespace kvbench
