#!/usr/bin/env python3
"""Writes tests/fixtures/chat/chat_cases.json: chat prompts rendered by Python's
jinja2 as vLLM's OpenAI server renders them (transformers' apply_chat_template
environment and continue_final_message cut, vLLM's message preparation), for
the chat templates in tests/fixtures/chat/ and tests/fixtures/template/ (all
written for Loom's tests, in the styles of the model families' own).
tests/unit/chat_renderer_test.cc renders every request with Loom's
ChatRenderer and requires byte-identical output (or an error where jinja2 raised).

  .venv/bin/python scripts/make_chat_fixtures.py

A case: {name, template (path under tests/fixtures/), request (the chat fields
as an OpenAI client sends them: messages, tools, documents,
chat_template_kwargs, add_generation_prompt, continue_final_message),
expected} or {..., error}.
"""
import copy
import datetime
import json
import pathlib
import re

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXTURES = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures"
SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


def environment():
    """transformers' _compile_jinja_template."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


# What src/chat/chat_renderer.cc's detect_content_format looks for (vLLM: a loop over message content).
CONTENT_LOOP = re.compile(r"""\bfor\s+[\w\s,()]+\s+in\s+\w+\s*(\[\s*['"]content['"]\s*\]|\.content\b)""")


def prepare_messages(messages, openai_format):
    """vLLM's parse_chat_messages + _postprocess_messages for one template."""
    prepared = []
    for message in copy.deepcopy(messages):
        content = message.get("content")
        if openai_format:
            if content is None:
                content = []
            elif isinstance(content, str):
                content = [{"type": "text", "text": content}]
        else:
            if content is None:
                content = ""
            elif isinstance(content, list):
                content = "\n".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
        message["content"] = content
        if message.get("role") == "developer":
            message["role"] = "system"
        for call in message.get("tool_calls") or []:
            arguments = call["function"].get("arguments")
            if not arguments:
                call["function"]["arguments"] = {}
            elif isinstance(arguments, str):
                call["function"]["arguments"] = json.loads(arguments)
        prepared.append(message)
    return prepared


def cut_after_final_message(rendered, final_message):
    """transformers' apply_chat_template with continue_final_message."""
    final = final_message["content"]
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                final = block["text"]
                break
        else:
            raise ValueError("no text to continue")
    if final.strip() not in rendered:
        raise ValueError("the final message does not appear in the rendered prompt")
    location = rendered.rindex(final.strip())
    if rendered[location:location + len(final.lstrip())] == final:
        return rendered[:location + len(final.lstrip())]
    return rendered[:location + len(final.strip())]


def render(env, source, request):
    template = env.from_string(source)
    openai_format = CONTENT_LOOP.search(source) is not None
    messages = prepare_messages(request["messages"], openai_format)
    context = {**SPECIAL_TOKENS, **request.get("chat_template_kwargs", {}), "messages": messages,
               "tools": request.get("tools"), "documents": request.get("documents"),
               "add_generation_prompt": request.get("add_generation_prompt", True)}
    rendered = template.render(**context)
    if request.get("continue_final_message"):
        rendered = cut_after_final_message(rendered, messages[-1])
    return rendered


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Searches the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}}},
]

CALL = {"id": "call00001", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}
CALL_ROME = {"id": "call00002", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"unit\": \"celsius\", \"city\": \"Rome\"}"}}

# The message sets, as an OpenAI client sends them (tool-call arguments as JSON strings, content null beside calls).
REQUESTS = {
    "plain": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system": {"messages": [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Hi there"}]},
    "developer": {"messages": [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]},
    "multi_turn": {"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "  4  "},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6"},
        {"role": "user", "content": "Thanks"}]},
    "tools": {"messages": [{"role": "system", "content": "You can check the weather."},
                           {"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS},
    "tool_call": {"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call00001", "content": "{\"temperature\": 21}"},
        {"role": "assistant", "content": "It is 21°C in Paris."},
        {"role": "user", "content": "Thanks"}], "tools": TOOLS},
    "tool_result": {"messages": [
        {"role": "system", "content": "You can check the weather."},
        {"role": "user", "content": "Compare Paris and Rome"},
        {"role": "assistant", "content": "", "tool_calls": [CALL, CALL_ROME]},
        {"role": "tool", "tool_call_id": "call00001", "content": "21"},
        {"role": "tool", "tool_call_id": "call00002", "content": "25"}], "tools": TOOLS},
    "content_parts": {"messages": [{"role": "user", "content": [{"type": "text", "text": "Describe"},
                                                                {"type": "text", "text": "briefly."}]}]},
    "continue": {"messages": [{"role": "user", "content": "Count to three"}, {"role": "assistant", "content": "One, two,"}],
                 "add_generation_prompt": False, "continue_final_message": True},
    "no_generation_prompt": {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}],
                             "add_generation_prompt": False},
}

TEMPLATES = [
    "template/chatml_tools.jinja",  # Qwen2.5
    "template/llama31_tools.jinja",  # Llama 3.1 / 3.3
    "template/mistral_inst.jinja",  # Mistral v1/v2
    "chat/llama32.jinja",
    "chat/qwen3.jinja",
    "chat/mistral_v3_tools.jinja",
    "chat/mistral_v7_tekken.jinja",
    "chat/gemma.jinja",
    "chat/phi3.jinja",
    "chat/phi4_mini.jinja",
    "chat/deepseek_r1.jinja",
    "chat/smollm2.jinja",
    "chat/smollm3.jinja",
    "chat/granite.jinja",
]

# Template-specific requests: thinking switches, dates, documents.
EXTRA = [
    ("chat/qwen3.jinja", "no_thinking", {"messages": REQUESTS["plain"]["messages"],
                                          "chat_template_kwargs": {"enable_thinking": False}}),
    ("chat/qwen3.jinja", "thinking_history", {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "content": "6", "reasoning_content": "Add three."}]}),
    ("chat/smollm3.jinja", "no_thinking", {"messages": REQUESTS["system"]["messages"],
                                            "chat_template_kwargs": {"enable_thinking": False, "date_string": "01 May 2025"}}),
    ("chat/smollm3.jinja", "no_think_flag", {"messages": [{"role": "system", "content": "Be terse. /no_think"},
                                                           {"role": "user", "content": "Hi"}]}),
    ("chat/granite.jinja", "thinking", {"messages": REQUESTS["plain"]["messages"], "chat_template_kwargs": {"thinking": True}}),
    ("chat/granite.jinja", "documents", {"messages": REQUESTS["plain"]["messages"],
                                         "documents": [{"doc_id": 1, "text": "Paris is in France."},
                                                       {"doc_id": "b", "text": "Rome is in Italy."}]}),
    ("chat/granite.jinja", "controls", {"messages": REQUESTS["plain"]["messages"],
                                        "chat_template_kwargs": {"controls": {"length": "short", "citations": True}}}),
    ("chat/deepseek_r1.jinja", "thinking_history", {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\n4"},
        {"role": "user", "content": "3+3?"}]}),
    ("chat/llama32.jinja", "python_tag", {"messages": [
        {"role": "user", "content": "Run it"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "python", "arguments": "{\"code\": \"print(1)\"}"}}]},
        {"role": "ipython", "content": "1"}], "tools": TOOLS}),
]


def main():
    env = environment()
    cases = []
    jobs = [(path, name, request) for path in TEMPLATES for name, request in REQUESTS.items()] + EXTRA
    for path, name, request in jobs:
        request = copy.deepcopy(request)
        if path == "chat/llama32.jinja":  # today's date otherwise: not reproducible
            request.setdefault("chat_template_kwargs", {}).setdefault("date_string", "02 Jan 2025")
        source = (FIXTURES / path).read_text()
        case = {"name": f"{pathlib.Path(path).stem}/{name}", "template": path, "request": request}
        try:
            case["expected"] = render(env, source, request)
        except (jinja2.exceptions.TemplateError, ValueError, TypeError) as error:
            case["error"] = str(error)
        cases.append(case)
    out = FIXTURES / "chat/chat_cases.json"
    out.write_text(json.dumps({"jinja2_version": jinja2.__version__, "special_tokens": SPECIAL_TOKENS, "cases": cases},
                              indent=1, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases, {sum('error' in c for c in cases)} errors")


if __name__ == "__main__":
    main()
