// Task scorers: text normalisation, answer extraction and the metrics kvbench reports per
// turn. Framework-free (no model, no JSON), every score in [0, 1].
//
// Every metric takes the model's prediction and the LIST of accepted answers and returns
// the best score over the answers. A single string answer is one reference, never its
// characters (SCBench's QA F1 loops over a plain-string answer character by character).
// An empty answers list scores 0.
//
// Where kvbench differs from SCBench (MInference scbench/compute_scores.py) it says so at
// the function; tasks/README.md lists the differences.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvbench {

using Answers = std::vector<std::string>;

// ---- Normalisation ------------------------------------------------------------------

// SQuAD's normalize_answer, for English: ASCII lowercase, delete ASCII punctuation
// (string.punctuation, deleted, not replaced by a space: "well-known" -> "wellknown"),
// drop the articles "a", "an", "the" as whole words, collapse whitespace runs to one space
// and trim. Beyond SQuAD, so that a chat model's typography does not glue punctuation to
// words: the non-ASCII punctuation normalize_zh deletes (curly quotes, dashes, ellipsis,
// full-width forms) is deleted too, and Unicode spaces (U+00A0, U+3000, ...) are spaces.
// Other non-ASCII text passes through unchanged (no Unicode lowercasing).
std::string normalize_en(std::string_view text);

// For Chinese: ASCII lowercase, then delete every whitespace code point (ASCII, U+3000
// ideographic space, no-break and other Unicode spaces) and every punctuation code point:
// ASCII punctuation, full-width forms (！＂＃…／ ：；＜＝＞？＠ ［＼］＾＿｀ ｛｜｝～ and the
// half-width ｟｠｡｢｣､･), CJK punctuation (、。〃 〈〉《》「」『』【】〔〕〖〗〘〙〚〛
// 〜〝〞〟〰〽〾〿), general punctuation (– — ‘ ’ ‚ ‛ “ ” „ ‟ † ‡ • ‥ … ‧ ‰ ′ ″ ‹ › ※ …),
// CJK compatibility and small forms (U+FE10–U+FE19, U+FE30–U+FE6B), · « » ¡ ¿.
// Letters and numbers such as 々 and 〇 are kept. Invalid UTF-8 bytes are kept as they are.
std::string normalize_zh(std::string_view text);

// The code points of UTF-8 text; an invalid byte becomes one U+FFFD.
std::u32string utf8_code_points(std::string_view text);

// ---- Answer extraction ----------------------------------------------------------------

// The answer inside a chat model's phrasing, for key-value style retrieval:
//   1. trim; keep the first non-empty line;
//   2. while the text has a cue, keep what follows the EARLIEST one (the longest cue on a
//      tie); cues, case-insensitive: "answer is", "answer:", "value is", "value:", " is ",
//      ": " (so "Answer: The value of key X is 289." -> "The value of key X is 289." ->
//      "289.");
//   3. after a cue: if the text starts with a quote (" ' ` “ ‘ «), return what is inside
//      it; otherwise cut at the first ", ", "; " or sentence end (". ", "! ", "? "), so
//      "The value is 289, which is ..." -> "289";
//   4. trim whitespace, surrounding quotes, markdown ** * and `, and trailing . , ; : ! ?
// "The value of key \"abc\" is \"289\"." -> "289". A prediction with no cue is its first
// line, trimmed and unquoted ("**289**." -> "289"). A heuristic for exact_match, which also
// compares the whole prediction; contains and the F1 scores read the whole prediction.
std::string extract_answer(std::string_view prediction);

// Which number extract_number returns when a prediction has several.
enum class NumberPick { first, last };

// A number in the prediction: optional sign (- + or U+2212 minus, only when not preceded
// by a letter or digit, so "3-5" reads 3 and "key-7" reads 7), digits with optional
// thousands separators ("1,234,567": first group 1-3 digits, then groups of exactly three;
// "1,2" is 1 then 2), an optional decimal part ("3.5", ".5"; "94." is 94). A number glued
// to a preceding letter ("a3f9", "v2") is not a number. No exponents, no spelled numbers.
// nullopt when there is none.
// The first number is the default: SCBench's Math.Find scorer takes the first, and a chat
// model states the value before it explains it ("The largest number is 94. It appears
// after ..."); NumberPick::last suits chain-of-thought output that ends with the result.
std::optional<double> extract_number(std::string_view prediction,
                                     NumberPick pick = NumberPick::first);

// The option label a multiple-choice prediction chose, upper-case ("B"), or nullopt when
// it cannot be told. Labels are single letters; with `options` given (their texts, in
// label order A, B, ...) only labels of existing options count. Tried in order:
//   1. a cue word followed by optional "is", "would be", "should be", ":", "=", "-", "*",
//      then a label, optionally bracketed: "Answer: B", "The answer is (B)",
//      "The answer is B) foo", "ANSWER: (B)", "option C". Cues, case-insensitive: the
//      earliest "answer" that parses, else the earliest "option"/"choice" that parses (so
//      "Option A is wrong; the answer is C." chooses C);
//   2. a bracketed label anywhere: "(B)", "[B]" (lower case accepted here: "(b)");
//   3. a label opening the prediction, alone or followed by . ) : , * a quote or a newline:
//      "B", "B.", "B) foo", "B: foo" (not "A man ...", an article, nor "I'd ...");
//   4. with options: the text of exactly one option in the prediction (normalize_en,
//      whole words; an option whose text is inside another found option's text yields);
//   5. a lone capital letter, neither glued to letters or digits, nor the words "A"/"I"
//      before a lower-case word, nor a contraction ("I'd"), when exactly one distinct
//      such label occurs ("I think B is right" -> B; "B or C" -> nothing).
// Upper-case letters only outside brackets, so "the answer is a guess" chooses nothing.
std::optional<std::string> extract_choice(std::string_view prediction,
                                          const std::vector<std::string>& options = {});

// ---- Metrics (max over answers, in [0, 1]) -------------------------------------------

// 1 when normalize_en of the prediction, or of extract_answer(prediction), equals
// normalize_en of an answer; for answers with non-ASCII text normalize_zh is compared too.
double exact_match(std::string_view prediction, const Answers& answers);

// 1 when an answer occurs in the prediction: its normalize_en tokens as a contiguous run
// of the prediction's normalize_en tokens (whole words, so "289" is not in "2890"), or, for
// an answer with non-ASCII text, normalize_zh(answer) as a substring of
// normalize_zh(prediction). An answer that normalises to nothing matches nothing.
double contains(std::string_view prediction, const Answers& answers);

// The share of the answers that occur in the prediction, each tested as by `contains`.
// Here the answers are ALL required, not alternatives: RULER's string_match_all, for
// turns whose gold is a set (variable tracking: every variable holding the value). 0 for
// an empty answers list.
double contains_all(std::string_view prediction, const Answers& answers);

// SQuAD token F1 over normalize_en whitespace tokens with multiset overlap (a token
// repeated twice in the prediction and once in the answer counts once). 0 when either side
// has no tokens.
double token_f1(std::string_view prediction, const Answers& answers);

// Character F1 for Chinese over the code points (not bytes) of normalize_zh, with multiset
// overlap. 0 when either side is empty.
double char_f1(std::string_view prediction, const Answers& answers);

// 1 when extract_choice(prediction, options) equals the gold label exactly. A gold answer
// is a label when, stripped of whitespace, brackets and a trailing ".", it is one letter
// ("B", "(B)", "b"); with options, a gold answer equal (normalize_en) to an option's text
// stands for that option's label. A gold answer that is neither (BBH's "True", "valid")
// is scored by exact_match. SCBench's ICL.ManyShot scorer instead counts the label as right
// when it occurs anywhere in the upper-cased prediction, so "ANSWER: (B)" scores 1 for
// gold "A"; here it scores 0.
double multiple_choice(std::string_view prediction, const Answers& answers,
                       const std::vector<std::string>& options = {});

// 1 when the first number of the prediction (extract_number, NumberPick::first) equals
// the first number of an answer, relative tolerance 1e-9 ("3.50" == "3.5",
// "1,234" == "1234"). 0 when either has no number.
double numeric_match(std::string_view prediction, const Answers& answers);

// Code similarity for a RepoQA-style turn: token F1 over whitespace tokens of the code,
// case and punctuation kept, where the prediction's code is its first fenced ``` block
// (the whole prediction when it has none). 0 when either side is empty.
double code_f1(std::string_view prediction, const Answers& answers);

// ---- Registry --------------------------------------------------------------------------

// function: RepoQA's check of a repeated function (tasks/function_similarity.h).
enum class Scorer { exact, contains, f1_en, f1_zh, choice, number, code, contains_all, function };

// Every scorer's name, in enum order: exact contains f1_en f1_zh choice number code
// contains_all function.
const std::vector<std::string>& scorer_names();
const char* scorer_name(Scorer scorer);
// Throws InputError naming the unknown name and the known ones.
Scorer scorer_from_name(const std::string& name);

// The scorer's metric on one prediction (choice: no option texts; contains_all: the
// answers are all required).
double score(Scorer scorer, std::string_view prediction, const Answers& answers);

// ---- Mixed retrieval (SCBench's Mix.RepoQA+KV) -----------------------------------------

// Which half of a mixed task a turn belongs to.
enum class MixPart { kv, code };

struct MixedTurn {
  MixPart part = MixPart::kv;
  std::string prediction;  // the model's TEXT for this turn
  Answers answers;
};

struct MixedScore {
  double kv = 0;       // mean over the kv turns (0 when there are none)
  double code = 0;     // mean over the code turns (0 when there are none)
  double overall = 0;  // mean over all turns
  int n_kv = 0;
  int n_code = 0;
};

// One turn: kv turns by `contains` on the prediction text (the value as whole words, as
// SCBench's KV scorer intends), code turns by code_f1. In multi-request mode SCBench hands
// the whole prediction records, not their text, to its KV scorer, so `label in pred` tests
// dictionary keys and every KV turn scores 0; kvbench always scores the text, in both modes.
double score_mixed_turn(const MixedTurn& turn);
MixedScore score_mixed_retrieval(const std::vector<MixedTurn>& turns);

}  // namespace kvbench
