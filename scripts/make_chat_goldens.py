#!/usr/bin/env python3
"""Chat renderings by transformers' own Jinja engine, for qinfer's C++ chat formatting test.

Qwen3: the template shipped in assets/tokenizers/qwen3-tokenizer/tokenizer_config.json. Qwen2.5-Instruct: the
published ChatML template (scripts/qwen2.5_chat_template.jinja; Qwen2.5's tokenizer_config in assets has none).
usage: make_chat_goldens.py OUT.json
"""
import json
import sys

from transformers import AutoTokenizer

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city, in °C",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "c"}}}
CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_user": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    "multi_turn": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke.\nA short one."}],
    "tools": [{"role": "user", "content": "Weather in Zürich and Oslo?"},
              {"role": "assistant", "content": "", "tool_calls": [CALL, {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
              {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "tool", "content": "{\"temp\": 9}"},
              {"role": "assistant", "content": "Zürich 21 °C, Oslo 9 °C."}, {"role": "user", "content": "Thanks"}],
    "tools_with_system": [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Rome?"},
                          {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL]},
                          {"role": "tool", "content": "sunny"}],
    "thinking_history": [{"role": "user", "content": "Q1"},
                         {"role": "assistant", "content": "<think>\nfirst thought\n</think>\n\nA1"},
                         {"role": "user", "content": "Q2"},
                         {"role": "assistant", "content": "<think>\nsecond\n</think>\n\nA2"}],
    "reasoning_field": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": "because"},
                        {"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
                        {"role": "assistant", "content": "B", "reasoning_content": "then"}],
}


def main():
    out = []
    qwen3 = AutoTokenizer.from_pretrained("assets/tokenizers/qwen3-tokenizer")
    qwen25 = AutoTokenizer.from_pretrained("assets/tokenizers/qwen2.5-tokenizer")
    template25 = open("scripts/qwen2.5_chat_template.jinja").read()
    for name, msgs in CONVERSATIONS.items():
        tools = [WEATHER] if name.startswith("tools") else None
        for gen in (True, False):
            for think in ((True, False) if name in ("user", "tools") else (True,)):
                kw = {"tools": tools} if tools else {}
                s3 = qwen3.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, enable_thinking=think, **kw)
                case = {"name": f"qwen3/{name}/gen={gen}/think={think}", "style": "qwen3", "messages": msgs,
                        "add_generation_prompt": gen, "enable_thinking": think, "expected": s3}
                if tools:
                    case["tools"] = tools
                out.append(case)
            if name in ("thinking_history", "reasoning_field"):
                continue
            kw = {"tools": tools} if tools else {}
            s25 = qwen25.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, chat_template=template25, **kw)
            case = {"name": f"qwen2.5/{name}/gen={gen}", "style": "qwen2.5", "messages": msgs, "add_generation_prompt": gen,
                    "expected": s25}
            if tools:
                case["tools"] = tools
            out.append(case)
    json.dump(out, open(sys.argv[1], "w"), indent=1, ensure_ascii=False)
    print(f"chat goldens: {len(out)} cases")


if __name__ == "__main__":
    main()
