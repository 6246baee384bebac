"""Tool calling against a real `loom serve` with the `openai` client, on a
random-weight model under a Qwen3-style (Hermes `<tool_call>`) chat template:
tool_choice required / named give calls whose arguments validate against the
tool's parameters; streamed tool-call deltas reassemble to the non-streamed
call; tool_choice auto parses the calls the model writes (the text is forced
with a regex constraint, since a random model never writes one by itself);
a whole agent loop (call -> tool result -> answer) goes through."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402

try:
    import jsonschema
except ImportError:  # pragma: no cover
    print("jsonschema is not installed (scripts/python-requirements.txt)")
    sys.exit(77)

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "chat", "qwen3.jinja")
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                        "unit": {"enum": ["C", "F"]}},
                       "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Local time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8},
                                                        "hours": {"type": "integer", "minimum": 0, "maximum": 23}},
                       "required": ["zone", "hours"]}}},
]
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
# What a Hermes-style model writes for one call (the hermes parser reads it).
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HERMES_REGEX = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}\n</tool_call>'


def reassemble(chunks):
    """(content, calls, finish_reason) from a chat stream: deltas joined per tool-call index."""
    content, calls, finish = "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
            if call.id:
                entry["id"] = call.id
            if call.function and call.function.name:
                entry["name"] += call.function.name
            if call.function and call.function.arguments:
                entry["arguments"] += call.function.arguments
        finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


class ToolCallTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--chat-template", TEMPLATE, "--tool-call-parser", "auto", "--max-context-tokens", "4096"]
    SERVER_KWARGS = {"num_adapters": 1}

    def chat(self, messages=None, **kwargs):
        kwargs.setdefault("max_tokens", 300)
        return self.client.chat.completions.create(model="tiny", messages=messages or MESSAGES, tools=TOOLS,
                                                   **kwargs)

    def assert_valid_call(self, name, arguments):
        self.assertIn(name, SCHEMAS)
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])

    def test_required_and_named_calls_validate(self):
        names = set()
        for seed in range(8):
            choice = self.chat(tool_choice="required", temperature=1.0, seed=seed).choices[0]
            self.assertEqual(choice.finish_reason, "tool_calls", choice.message)
            self.assertGreaterEqual(len(choice.message.tool_calls), 1)
            for call in choice.message.tool_calls:
                self.assertEqual(call.type, "function")
                self.assertTrue(call.id)
                self.assert_valid_call(call.function.name, call.function.arguments)
                names.add(call.function.name)
        self.assertTrue(names)
        for seed in range(4):
            choice = self.chat(tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=1.0,
                               seed=seed).choices[0]
            self.assertEqual(len(choice.message.tool_calls), 1)
            call = choice.message.tool_calls[0]
            self.assertEqual(call.function.name, "get_time")
            self.assert_valid_call("get_time", call.function.arguments)
        # parallel_tool_calls false: one call at most.
        for seed in range(4):
            choice = self.chat(tool_choice="required", parallel_tool_calls=False, temperature=1.0,
                               seed=seed).choices[0]
            self.assertEqual(len(choice.message.tool_calls), 1)

    def test_streamed_calls_reassemble_to_the_whole_response(self):
        cases = [{"tool_choice": "required"},
                 {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
                 {"tool_choice": "auto", "extra_body": {"structured_outputs": {"regex": HERMES_REGEX}}}]
        for case in cases:
            # A named tool_choice ends with "stop", as OpenAI's and vLLM's do.
            expected_finish = "stop" if isinstance(case["tool_choice"], dict) else "tool_calls"
            for seed in range(3):
                whole = self.chat(temperature=1.0, seed=seed, **case).choices[0]
                content, calls, finish = reassemble(self.chat(temperature=1.0, seed=seed, stream=True, **case))
                self.assertEqual(finish, whole.finish_reason, case)
                self.assertEqual(finish, expected_finish, case)
                self.assertGreaterEqual(len(calls), 1, case)
                self.assertEqual([(c["name"], c["arguments"]) for c in calls],
                                 [(c.function.name, c.function.arguments) for c in whole.message.tool_calls], case)
                self.assertTrue(all(c["id"] for c in calls))
                self.assertEqual(content, whole.message.content or "")

    def test_auto_parses_the_calls_the_model_writes_and_none_keeps_them_as_text(self):
        forced = {"structured_outputs": {"regex": HERMES_REGEX}}
        choice = self.chat(tool_choice="auto", extra_body=forced).choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")
        self.assertFalse(choice.message.content)
        self.assertEqual(len(choice.message.tool_calls), 1)
        self.assertEqual(choice.message.tool_calls[0].function.name, "get_weather")
        self.assertEqual(json.loads(choice.message.tool_calls[0].function.arguments), {"city": "Paris"})
        choice = self.chat(tool_choice="none", extra_body=forced).choices[0]
        self.assertEqual(choice.finish_reason, "stop")
        self.assertIsNone(choice.message.tool_calls)
        self.assertEqual(choice.message.content, HERMES_CALL)

    def test_agent_loop_call_result_answer(self):
        messages = list(MESSAGES)
        first = self.chat(messages, tool_choice="required", temperature=0.0)
        call = first.choices[0].message.tool_calls[0]
        messages.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump()]})
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "21 degrees and sunny"})
        answer = self.chat(messages, tool_choice="auto", temperature=0.0, max_tokens=16,
                           extra_body={"ignore_eos": True})
        choice = answer.choices[0]
        self.assertEqual(choice.finish_reason, "length")
        self.assertIsInstance(choice.message.content, str)
        self.assertIsNone(choice.message.tool_calls)
        # The call and its result reached the prompt.
        self.assertGreater(answer.usage.prompt_tokens, first.usage.prompt_tokens + 10)
        # A malformed tool turn is the client's error, named by its path; the server keeps serving.
        bad = messages[:-1] + [{"role": "tool", "tool_call_id": 7, "content": "21 degrees"}]
        with self.assertRaises(openai.BadRequestError) as raised:
            self.chat(bad, tool_choice="auto", max_tokens=4)
        self.assertEqual(raised.exception.body["param"], "messages[2].tool_call_id")
        self.assertEqual(self.chat(messages, tool_choice="auto", temperature=0.0, max_tokens=16,
                                   extra_body={"ignore_eos": True}).choices[0].message.content, choice.message.content)


if __name__ == "__main__":
    unittest.main()
