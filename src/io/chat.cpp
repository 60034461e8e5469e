#include "io/chat.h"

#include <cstdio>

#include "core/check.h"

namespace qinfer {

namespace {

const char * k_qwen25_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
const char * k_tools_intro =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures "
    "within <tools></tools> XML tags:\n<tools>";
const char * k_tools_outro =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";

// Python's str.strip/lstrip/rstrip with a character set.
std::string lstrip(const std::string & s, const char * chars) {
    size_t i = s.find_first_not_of(chars);
    return i == std::string::npos ? "" : s.substr(i);
}
std::string rstrip(const std::string & s, const char * chars) {
    size_t i = s.find_last_not_of(chars);
    return i == std::string::npos ? "" : s.substr(0, i + 1);
}
std::string strip(const std::string & s, const char * chars) { return lstrip(rstrip(s, chars), chars); }

void dump_string(const std::string & s, std::string & out) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
            if (c < 0x20) {
                char buf[8];
                std::snprintf(buf, sizeof buf, "\\u%04x", c);
                out += buf;
            } else {
                out += char(c);
            }
        }
    }
    out += '"';
}

void dump(const nlohmann::ordered_json & j, std::string & out) {
    switch (j.type()) {
    case nlohmann::json::value_t::object: {
        out += '{';
        bool first = true;
        for (auto it = j.begin(); it != j.end(); ++it) {
            if (!first) out += ", ";
            first = false;
            dump_string(it.key(), out);
            out += ": ";
            dump(it.value(), out);
        }
        out += '}';
        break;
    }
    case nlohmann::json::value_t::array: {
        out += '[';
        for (size_t i = 0; i < j.size(); i++) {
            if (i) out += ", ";
            dump(j[i], out);
        }
        out += ']';
        break;
    }
    case nlohmann::json::value_t::string: dump_string(j.get<std::string>(), out); break;
    case nlohmann::json::value_t::boolean: out += j.get<bool>() ? "true" : "false"; break;
    case nlohmann::json::value_t::null: out += "null"; break;
    default: out += j.dump(); break;  // numbers
    }
}

// The tool call text both templates write: <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>
std::string tool_call_text(const nlohmann::ordered_json & call, bool string_arguments_verbatim) {
    const nlohmann::ordered_json & f = call.contains("function") ? call["function"] : call;
    std::string s = "<tool_call>\n{\"name\": \"" + f.value("name", std::string()) + "\", \"arguments\": ";
    const nlohmann::ordered_json args = f.contains("arguments") ? f["arguments"] : nlohmann::ordered_json::object();
    s += string_arguments_verbatim && args.is_string() ? args.get<std::string>() : python_json(args);
    return s + "}\n</tool_call>";
}

void tool_message(const std::vector<ChatMessage> & m, size_t i, std::string & out) {
    if (i == 0 || m[i - 1].role != "tool") out += "<|im_start|>user";
    out += "\n<tool_response>\n" + m[i].content + "\n</tool_response>";
    if (i + 1 == m.size() || m[i + 1].role != "tool") out += "<|im_end|>\n";
}

std::string tools_block(const nlohmann::ordered_json & tools) {
    std::string s = k_tools_intro;
    for (const auto & t : tools) {
        s += '\n';
        s += python_json(t);
    }
    return s + k_tools_outro;
}

std::string qwen25(const std::vector<ChatMessage> & m, const ChatOptions & opt) {
    std::string out;
    const bool has_system = !m.empty() && m[0].role == "system";
    if (!opt.tools.empty()) {
        out += "<|im_start|>system\n" + (has_system ? m[0].content : std::string(k_qwen25_system)) + "\n\n" + tools_block(opt.tools);
    } else {
        out += "<|im_start|>system\n" + (has_system ? m[0].content : std::string(k_qwen25_system)) + "<|im_end|>\n";
    }
    for (size_t i = 0; i < m.size(); i++) {
        const ChatMessage & msg = m[i];
        if (msg.role == "user" || (msg.role == "system" && i != 0) || (msg.role == "assistant" && msg.tool_calls.empty())) {
            out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
        } else if (msg.role == "assistant") {
            out += "<|im_start|>assistant";
            if (!msg.content.empty()) out += "\n" + msg.content;
            for (const auto & call : msg.tool_calls) {
                out += '\n';
                out += tool_call_text(call, false);
            }
            out += "<|im_end|>\n";
        } else if (msg.role == "tool") {
            tool_message(m, i, out);
        }
    }
    if (opt.add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
}

std::string qwen3(const std::vector<ChatMessage> & m, const ChatOptions & opt) {
    std::string out;
    const bool has_system = !m.empty() && m[0].role == "system";
    if (!opt.tools.empty()) {
        out += "<|im_start|>system\n";
        if (has_system) out += m[0].content + "\n\n";
        out += tools_block(opt.tools);
    } else if (has_system) {
        out += "<|im_start|>system\n" + m[0].content + "<|im_end|>\n";
    }
    // The last user turn that is not a bundle of tool responses: thinking is kept only after it.
    size_t last_query = m.empty() ? 0 : m.size() - 1;
    for (size_t k = m.size(); k-- > 0;) {
        const std::string & c = m[k].content;
        const bool tool_resp = c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 && c.compare(c.size() - 16, 16, "</tool_response>") == 0;
        if (m[k].role == "user" && !tool_resp) {
            last_query = k;
            break;
        }
    }
    for (size_t i = 0; i < m.size(); i++) {
        const ChatMessage & msg = m[i];
        if (msg.role == "user" || (msg.role == "system" && i != 0)) {
            out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
        } else if (msg.role == "assistant") {
            std::string content = msg.content, reasoning = msg.reasoning_content;
            if (reasoning.empty() && content.find("</think>") != std::string::npos) {
                // content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n'), and the text after the last </think>
                std::string before = rstrip(content.substr(0, content.find("</think>")), "\n");
                const size_t open = before.rfind("<think>");
                reasoning = lstrip(open == std::string::npos ? before : before.substr(open + 7), "\n");
                content = lstrip(content.substr(content.rfind("</think>") + 8), "\n");
            }
            const bool last = i + 1 == m.size();
            if (i > last_query && (last || !reasoning.empty())) {
                out += "<|im_start|>assistant\n<think>\n" + strip(reasoning, "\n") + "\n</think>\n\n" + lstrip(content, "\n");
            } else {
                out += "<|im_start|>assistant\n" + content;
            }
            for (size_t c = 0; c < msg.tool_calls.size(); c++) {
                if ((c == 0 && !content.empty()) || c > 0) out += "\n";
                out += tool_call_text(msg.tool_calls[c], true);
            }
            out += "<|im_end|>\n";
        } else if (msg.role == "tool") {
            tool_message(m, i, out);
        }
    }
    if (opt.add_generation_prompt) {
        out += "<|im_start|>assistant\n";
        if (!opt.enable_thinking) out += "<think>\n\n</think>\n\n";
    }
    return out;
}

std::string chatml(const std::vector<ChatMessage> & m, const ChatOptions & opt) {
    std::string out;
    for (const ChatMessage & msg : m) out += "<|im_start|>" + msg.role + "\n" + msg.content + "<|im_end|>\n";
    if (opt.add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
}

}  // namespace

std::string python_json(const nlohmann::ordered_json & j) {
    std::string out;
    dump(j, out);
    return out;
}

ChatStyle detect_chat_style(const std::string & t, bool * recognised) {
    *recognised = true;
    if (t.empty()) return ChatStyle::Qwen25;
    if (t.find("<|im_start|>") != std::string::npos) {
        if (t.find("enable_thinking") != std::string::npos || t.find("reasoning_content") != std::string::npos) return ChatStyle::Qwen3;
        if (t.find("You are Qwen, created by Alibaba Cloud") != std::string::npos) return ChatStyle::Qwen25;
    }
    *recognised = false;
    return ChatStyle::ChatML;
}

std::string apply_chat_template(ChatStyle style, const std::vector<ChatMessage> & messages, const ChatOptions & opt) {
    for (const auto & m : messages) {
        if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
            QINFER_FAIL() << "chat: unknown role '" << m.role << "' (system, user, assistant, tool)";
        }
    }
    switch (style) {
    case ChatStyle::Qwen25: return qwen25(messages, opt);
    case ChatStyle::Qwen3: return qwen3(messages, opt);
    case ChatStyle::ChatML: return chatml(messages, opt);
    }
    return {};
}

}  // namespace qinfer
