// Chat templates: ChatML (SmolLM2, Qwen) and Llama-3. Chosen from tokenizer.chat_template.
#pragma once

#include <string>
#include <vector>

namespace kvbench {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatFormat { ChatML, Llama3 };

// Picks the format from a Jinja template string; ChatML when it is empty or unrecognised.
ChatFormat detect_chat_format(const std::string& jinja_template);

// Renders the conversation; with add_generation_prompt the assistant header is appended.
// ChatML inserts SmolLM2's default system prompt when the first message is not a system one
// and `default_system` is non-empty (what the GGUF's template does).
std::string render_chat(ChatFormat format, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt, const std::string& default_system = "");

// The system prompt a ChatML template inserts when the conversation has none: the literal
// text after "<|im_start|>system\n" up to "<|im_end|>" in the Jinja source (SmolLM2's
// "You are a helpful AI assistant named SmolLM, ..."), or "" when the template has none.
std::string default_system_prompt(const std::string& jinja_template);

// The token text that ends an assistant turn ("<|im_end|>" or "<|eot_id|>").
const char* end_of_turn_token(ChatFormat format);

}  // namespace kvbench
