#include "harness/model/chat_template.h"

namespace kvbench {

namespace {

// Llama-3's template (and llama.cpp's built-in copy of it) trims each message's content.
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t first = s.find_first_not_of(ws);
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(ws) - first + 1);
}

std::string render_chatml(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                          const std::string& default_system) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && messages[0].role != "system" && !default_system.empty()) {
      out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
    }
    out += "<|im_start|>" + messages[i].role + "\n" + messages[i].content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

std::string render_llama3(const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out = "<|begin_of_text|>";
  for (const ChatMessage& m : messages) {
    out +=
        "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
  }
  if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace

ChatFormat detect_chat_format(const std::string& jinja_template) {
  return jinja_template.find("<|start_header_id|>") != std::string::npos ? ChatFormat::Llama3
                                                                         : ChatFormat::ChatML;
}

std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt, const std::string& default_system) {
  switch (format) {
    case ChatFormat::Llama3:
      return render_llama3(messages, add_generation_prompt);
    case ChatFormat::ChatML:
      break;
  }
  return render_chatml(messages, add_generation_prompt, default_system);
}

std::string default_system_prompt(const std::string& jinja_template) {
  // The newline after the role is a real one in GGUF files, an escaped "\n" in some others.
  // A template may open the system message in several branches (Qwen's tools branch first);
  // the default is the first one whose text up to <|im_end|> is a literal.
  for (const std::string open : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    for (size_t begin = jinja_template.find(open); begin != std::string::npos;
         begin = jinja_template.find(open, begin + 1)) {
      const size_t text = begin + open.size();
      const size_t end = jinja_template.find("<|im_end|>", text);
      if (end == std::string::npos) break;
      const std::string prompt = jinja_template.substr(text, end - text);
      // A template that builds the system message from variables has no literal default.
      if (prompt.find_first_of("{}'\"+") == std::string::npos) return prompt;
    }
  }
  return "";
}

const char* end_of_turn_token(ChatFormat format) {
  return format == ChatFormat::Llama3 ? "<|eot_id|>" : "<|im_end|>";
}

}  // namespace kvbench
