// Chat templates: the format and default system prompt found in any Jinja text, and any
// conversation rendered in both formats (every message's content appears in the prompt).
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "harness/model/chat_template.h"

using namespace kvbench;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // The input is a template, then \x00-separated messages: role byte, content.
  const size_t end = text.find('\0');
  const std::string jinja = text.substr(0, end);
  const ChatFormat format = detect_chat_format(jinja);
  const std::string system = default_system_prompt(jinja);
  std::vector<ChatMessage> messages;
  static const char* const kRoles[] = {"system", "user", "assistant"};
  for (size_t at = end; at != std::string::npos && at + 1 < text.size();) {
    const size_t next = text.find('\0', at + 1);
    const std::string part = text.substr(at + 1, next == std::string::npos ? next : next - at - 1);
    if (!part.empty()) messages.push_back({kRoles[static_cast<uint8_t>(part[0]) % 3], part.substr(1)});
    at = next;
  }
  for (const ChatFormat f : {format, ChatFormat::ChatML, ChatFormat::Llama3}) {
    for (const bool generation : {false, true}) {
      const std::string prompt = render_chat(f, messages, generation, system);
      for (const ChatMessage& m : messages) {  // Llama-3 trims each content, as its template
        const std::string ws = " \t\n\r\f\v";
        const size_t first = m.content.find_first_not_of(ws);
        const std::string shown =
            f == ChatFormat::ChatML || first == std::string::npos
                ? (f == ChatFormat::ChatML ? m.content : "")
                : m.content.substr(first, m.content.find_last_not_of(ws) - first + 1);
        FUZZ_CHECK(prompt.find(shown) != std::string::npos);
      }
    }
  }
  FUZZ_CHECK(end_of_turn_token(format) != nullptr);
  return 0;
}
