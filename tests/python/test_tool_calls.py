"""Tool calling against a real `loom serve` with the `openai` client, on a
random-weight model under a Qwen3-style (Hermes `<tool_call>`) chat template:
tool_choice required / named give calls whose arguments validate against the
tool's parameters; streamed tool-call chunks have OpenAI's shape and reassemble
(by hand and by the openai client's accumulator) to the non-streamed call; a
forced call cut by max_tokens is a partial call, never content; tools a
template cannot render are a 400; tool_choice auto parses the calls the model writes (the text is forced
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


def assert_openai_chunk_sequence(test, chunks, case):
    """OpenAI's shape: a call's first delta (index, id, type, name, "" arguments), >= 1 argument delta, then
    finish_reason alone (empty delta) in the last chunk."""
    choices = [chunk.choices[0] for chunk in chunks if chunk.choices]
    finishes = [i for i, choice in enumerate(choices) if choice.finish_reason]
    test.assertEqual(finishes, [len(choices) - 1], case)
    last = choices[-1].delta
    test.assertFalse(last.content or last.tool_calls, case)
    argument_deltas = {}
    for choice in choices:
        for call in choice.delta.tool_calls or []:
            test.assertEqual(len(choice.delta.tool_calls), 1, case)
            if call.id:
                test.assertNotIn(call.index, argument_deltas, case)
                test.assertEqual(call.type, "function", case)
                test.assertTrue(call.function.name, case)
                test.assertEqual(call.function.arguments, "", case)
                argument_deltas[call.index] = 0
            else:
                test.assertIn(call.index, argument_deltas, case)
                test.assertIsNone(call.function.name, case)
                test.assertTrue(call.function.arguments, case)
                argument_deltas[call.index] += 1
    test.assertTrue(argument_deltas, case)
    test.assertTrue(all(count >= 1 for count in argument_deltas.values()), (case, argument_deltas))
    return argument_deltas


def merged_by_openai(chunks):
    """The openai client's own stream accumulator (what .stream() helpers return)."""
    from openai.lib.streaming.chat import ChatCompletionStreamState
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(chunk)
    return state.get_final_completion().choices[0]


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
                chunks = list(self.chat(temperature=1.0, seed=seed, stream=True, **case))
                argument_deltas = assert_openai_chunk_sequence(self, chunks, case)
                if "structured_outputs" not in case.get("extra_body", {}):  # forced: arguments as generated
                    self.assertGreater(max(argument_deltas.values()), 1, case)
                merged = merged_by_openai(chunks)
                self.assertEqual(merged.finish_reason, whole.finish_reason, case)
                self.assertEqual([(c.function.name, c.function.arguments) for c in merged.message.tool_calls],
                                 [(c.function.name, c.function.arguments) for c in whole.message.tool_calls], case)
                content, calls, finish = reassemble(chunks)
                self.assertEqual(finish, whole.finish_reason, case)
                self.assertEqual(finish, expected_finish, case)
                self.assertGreaterEqual(len(calls), 1, case)
                self.assertEqual([(c["name"], c["arguments"]) for c in calls],
                                 [(c.function.name, c.function.arguments) for c in whole.message.tool_calls], case)
                self.assertTrue(all(c["id"] for c in calls))
                self.assertEqual(content, whole.message.content or "")

    def test_forced_call_cut_by_max_tokens_is_a_partial_call(self):
        named = {"type": "function", "function": {"name": "get_weather"}}
        choice = self.chat(tool_choice=named, max_tokens=3, temperature=1.0, seed=1).choices[0]
        self.assertEqual(choice.finish_reason, "length")
        self.assertIsNone(choice.message.content)
        self.assertEqual(len(choice.message.tool_calls), 1)
        self.assertEqual(choice.message.tool_calls[0].function.name, "get_weather")
        partial = choice.message.tool_calls[0].function.arguments
        self.assertTrue(partial.startswith("{"), partial)
        chunks = list(self.chat(tool_choice=named, max_tokens=3, temperature=1.0, seed=1, stream=True))
        content, calls, finish = reassemble(chunks)
        self.assertEqual((content, finish), ("", "length"))
        self.assertEqual([(c["name"], c["arguments"]) for c in calls], [("get_weather", partial)])
        for max_tokens in (2, 6, 12):  # "required": never content, whatever the cut
            choice = self.chat(tool_choice="required", max_tokens=max_tokens, temperature=1.0, seed=2).choices[0]
            self.assertEqual(choice.finish_reason, "length")
            self.assertIsNone(choice.message.content, choice.message)

    def test_tools_the_template_cannot_render_are_a_400_naming_the_fix(self):
        with self.assertRaises(openai.BadRequestError) as raised:
            self.chat(tool_choice="auto", extra_body={"chat_template": "{{ messages[0]['content'] }}"})
        self.assertEqual(raised.exception.body["param"], "tool_choice")
        self.assertIn("--chat-template", raised.exception.body["message"])
        # Forced calls need no rendering (the constraint writes them); the server keeps serving.
        choice = self.chat(tool_choice="required", extra_body={"chat_template": "{{ messages[0]['content'] }}"},
                           max_tokens=300).choices[0]
        self.assertEqual(choice.finish_reason, "tool_calls")

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
