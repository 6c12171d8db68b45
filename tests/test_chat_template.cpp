// Pinned renderings of the two chat formats.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "harness/model/chat_template.h"

namespace kvbench {
namespace {

const char* kSmolSystem = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// tokenizer.chat_template of SmolLM2-135M-Instruct.Q4_1.gguf.
const char* kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

const char* kLlama3Template =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

TEST_CASE("detect_chat_format picks Llama-3 by its header token, else ChatML", "[unit]") {
  CHECK(detect_chat_format(kSmolTemplate) == ChatFormat::ChatML);
  CHECK(detect_chat_format(kLlama3Template) == ChatFormat::Llama3);
  CHECK(detect_chat_format("") == ChatFormat::ChatML);
  CHECK(detect_chat_format("{{ something else }}") == ChatFormat::ChatML);
}

TEST_CASE("default_system_prompt reads the literal system prompt of a ChatML template",
          "[unit]") {
  CHECK(default_system_prompt(kSmolTemplate) == kSmolSystem);
  // As stored in the GGUF: real newlines inside the Jinja string literal.
  std::string raw = kSmolTemplate;
  for (size_t at; (at = raw.find("\\n")) != std::string::npos;) raw.replace(at, 2, "\n");
  CHECK(default_system_prompt(raw) == kSmolSystem);
  CHECK(default_system_prompt(kLlama3Template).empty());
  CHECK(default_system_prompt("").empty());
  CHECK(default_system_prompt("{{ '<|im_start|>system\\n' + message['content'] + '<|im_end|>' }}")
            .empty());
}

TEST_CASE("default_system_prompt skips branches that build the system message (Qwen2.5's)",
          "[unit]") {
  // Qwen2.5's template, abridged: its tools branch opens the system message first, with the
  // default inside a Jinja expression; the plain branch then writes it as one literal.
  const std::string qwen =
      "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == "
      "'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'You are "
      "Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif %}\n    "
      "{{- \"\\n\\n# Tools ...</tools><|im_end|>\\n\" }}\n{%- else %}\n    {%- if "
      "messages[0]['role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + "
      "messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n        {{- "
      "'<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
      "assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}";
  const std::string system = default_system_prompt(qwen);
  CHECK(system == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  // Rendered as the template's plain branch writes it; a conversation's own system message
  // replaces it.
  CHECK(render_chat(detect_chat_format(qwen), {{"user", "Hi"}}, true, system) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(render_chat(ChatFormat::ChatML, {{"system", "Be brief."}, {"user", "Hi"}}, false, system) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  // With the plain branch's literal gone, no other branch has a literal default.
  std::string tools_only = qwen;
  tools_only.erase(tools_only.find("{%- else %}\n        {{- '<|im_start|>system\\nYou"));
  CHECK(default_system_prompt(tools_only).empty());
}

TEST_CASE("ChatML renders as SmolLM2's template does", "[unit]") {
  const std::vector<ChatMessage> user_only = {{"user", "What is 2+2?"}};
  CHECK(render_chat(ChatFormat::ChatML, user_only, true, kSmolSystem) ==
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(render_chat(ChatFormat::ChatML, user_only, false, kSmolSystem) ==
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n");
  // No default system prompt given: none inserted.
  CHECK(render_chat(ChatFormat::ChatML, user_only, true) ==
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");

  // A leading system message replaces the default; content is kept verbatim (no trimming).
  const std::vector<ChatMessage> conversation = {
      {"system", "Be brief."}, {"user", " Hi \n"}, {"assistant", "Hello!"}, {"user", "Bye"}};
  CHECK(render_chat(ChatFormat::ChatML, conversation, true, kSmolSystem) ==
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n Hi \n<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(render_chat(ChatFormat::ChatML, {}, true, kSmolSystem) == "<|im_start|>assistant\n");
  CHECK(std::string(end_of_turn_token(ChatFormat::ChatML)) == "<|im_end|>");
}

TEST_CASE("Llama-3 renders headers, trimmed content and eot tokens", "[unit]") {
  const std::vector<ChatMessage> conversation = {
      {"system", "Be brief."}, {"user", "  Hi there\n"}, {"assistant", "Hello!"}};
  CHECK(render_chat(ChatFormat::Llama3, conversation, true) ==
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  // Llama-3 has no default system prompt.
  CHECK(render_chat(ChatFormat::Llama3, {{"user", "Hi"}}, false, kSmolSystem) ==
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
  CHECK(std::string(end_of_turn_token(ChatFormat::Llama3)) == "<|eot_id|>");
}

}  // namespace
}  // namespace kvbench
