// Chat formatting of the Qwen family, written out in C++ from the checkpoints' Jinja templates (tokenizer_config.json):
// Qwen2.5's ChatML (default system prompt, tools), Qwen3's (thinking blocks, enable_thinking, tools). Anything
// else falls back to plain ChatML with a warning.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qinfer {

struct ChatMessage {
    std::string role;  // system | user | assistant | tool
    std::string content;
    std::string reasoning_content;                              // assistant (Qwen3), optional
    nlohmann::ordered_json tool_calls = nlohmann::ordered_json::array();  // assistant: [{"function": {"name", "arguments"}}]
};

enum class ChatStyle { Qwen25, Qwen3, ChatML };

// From the template text: Qwen3 (thinking), Qwen2.5 (ChatML with the Qwen system prompt), else ChatML. An empty
// template (base checkpoints) is Qwen2.5's ChatML. `recognised` is false for the fallback.
ChatStyle detect_chat_style(const std::string & template_text, bool * recognised);

struct ChatOptions {
    bool add_generation_prompt = true;
    bool enable_thinking = true;  // Qwen3: false inserts an empty think block after the generation prompt
    nlohmann::ordered_json tools = nlohmann::ordered_json::array();
};

std::string apply_chat_template(ChatStyle style, const std::vector<ChatMessage> & messages, const ChatOptions & opt);

// Jinja's `tojson` as transformers configures it: Python json.dumps(ensure_ascii=False), ", " and ": " separators.
std::string python_json(const nlohmann::ordered_json & j);

}  // namespace qinfer
