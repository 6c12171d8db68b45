// RepoQA's answer check for "repeat the described function": the function is cut out of the
// model's reply and compared with the reference by sentence BLEU; a turn passes at a
// similarity of 0.8, the threshold SCBench reports RepoQA at.
//
// Follows evalplus/repoqa 0.1.2 (repoqa/compute_score.py sanitize_output, repoqa/metric.py
// compute_function_similarity) and NLTK 3.10's sentence_bleu with SmoothingFunction().method4.
// Where kvbench differs: the function is found by indentation instead of tree-sitter
// (Python only), and RepoQA's verdict also asks that no other needle of the repository be
// more similar, which at 0.8 the reference's own similarity decides in practice.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvbench {

// The code the reply gives: with no ``` fence, the whole reply (trimmed); otherwise the
// first Python function (from its `def` or `async def` line through its last indented line)
// of the first fenced block that has one, else the first fenced block's body.
std::string sanitize_function_reply(std::string_view reply);

// NLTK's sentence_bleu of `candidate` against the one `reference`, both split at runs of
// whitespace after trimming (an empty text is one empty token, as Python's re.split):
// modified n-gram precisions for n = 1..4 weighted 1/4 each, method4 smoothing (k = 5: the
// i-th zero precision becomes 1 / (2^i k / ln(len)) over its denominator) and the brevity
// penalty. 0 when no unigram matches.
double sentence_bleu4(std::string_view candidate, std::string_view reference);

// RepoQA's similarity of a reply to a reference function: sentence_bleu4 of the sanitized
// reply against the reference.
double function_similarity(std::string_view reply, std::string_view reference);

// The `function` scorer: 1 when function_similarity reaches 0.8 for some answer, else 0.
constexpr double kFunctionMatchThreshold = 0.8;
double function_match(std::string_view reply, const std::vector<std::string>& answers);

}  // namespace kvbench
