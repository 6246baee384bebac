"""/v1/responses against a real `loom serve` with the `openai` client, on a
random-weight model under a Qwen3-style (Hermes `<tool_call>`) chat template:
string and item input, instructions, function tools under tool_choice
required / named (function_call items whose arguments validate), a 3-turn
previous_response_id chain through a function_call_output (the same prompt as
the items sent in full), the streamed event sequence as the client parses it,
GET / DELETE, store eviction (404), text.format json_schema / json_object,
adapters by `model` and workflow hints."""
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
    {"type": "function", "name": "get_weather", "description": "Current weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                     "unit": {"enum": ["C", "F"]}},
                    "required": ["city"]}},
    {"type": "function", "name": "get_time", "description": "Local time in a time zone",
     "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8},
                                                     "hours": {"type": "integer", "minimum": 0, "maximum": 23}},
                    "required": ["zone", "hours"]}},
]
SCHEMAS = {tool["name"]: tool["parameters"] for tool in TOOLS}
STORE_ENTRIES = 4


class ResponsesTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--chat-template", TEMPLATE, "--tool-call-parser", "auto", "--max-context-tokens", "4096",
                   "--responses-store-max-entries", str(STORE_ENTRIES)]
    SERVER_KWARGS = {"num_adapters": 1}

    def create(self, **kwargs):
        kwargs.setdefault("model", "tiny")
        kwargs.setdefault("max_output_tokens", 12)
        kwargs.setdefault("temperature", 0.0)
        return self.client.responses.create(**kwargs)

    def assert_valid_call(self, item):
        self.assertEqual(item.type, "function_call")
        self.assertTrue(item.call_id)
        self.assertTrue(item.id.startswith("fc_"))
        self.assertIn(item.name, SCHEMAS)
        jsonschema.validate(json.loads(item.arguments), SCHEMAS[item.name])

    def test_string_and_items_input_with_instructions(self):
        plain = self.create(input="Hello there")
        self.assertEqual(plain.object, "response")
        self.assertTrue(plain.id.startswith("resp_"))
        self.assertEqual(plain.model, "tiny")
        self.assertIn(plain.status, ("completed", "incomplete"))
        self.assertEqual(len(plain.output), 1)
        self.assertEqual(plain.output[0].type, "message")
        self.assertEqual(plain.output[0].role, "assistant")
        self.assertEqual(plain.output_text, plain.output[0].content[0].text)
        self.assertGreater(plain.usage.input_tokens, 0)
        self.assertLessEqual(plain.usage.output_tokens, 12)
        self.assertEqual(plain.usage.total_tokens, plain.usage.input_tokens + plain.usage.output_tokens)
        self.assertGreaterEqual(plain.usage.input_tokens_details.cached_tokens, 0)
        # The same conversation as items: the same prompt, the same (greedy) text.
        items = self.create(input=[{"role": "user", "content": [{"type": "input_text", "text": "Hello there"}]}])
        self.assertEqual(items.usage.input_tokens, plain.usage.input_tokens)
        self.assertEqual(items.output_text, plain.output_text)
        # Instructions go first, as a system message.
        instructed = self.create(input="Hello there", instructions="Answer in one word.")
        self.assertGreater(instructed.usage.input_tokens, plain.usage.input_tokens + 4)
        self.assertEqual(instructed.instructions, "Answer in one word.")
        as_system = self.create(input=[{"role": "system", "content": "Answer in one word."},
                                       {"role": "user", "content": "Hello there"}])
        self.assertEqual(as_system.usage.input_tokens, instructed.usage.input_tokens)
        # The token limit: status incomplete, as OpenAI reports it.
        cut = self.create(input="Hello there", max_output_tokens=5, extra_body={"ignore_eos": True})
        self.assertEqual(cut.status, "incomplete")
        self.assertEqual(cut.incomplete_details.reason, "max_output_tokens")
        self.assertEqual(cut.usage.output_tokens, 5)
        # A cached prefix shows in usage: the same prompt again.
        again = self.create(input="Hello there")
        self.assertGreater(again.usage.input_tokens_details.cached_tokens, 0)

    def test_function_tool_calls(self):
        names = set()
        for seed in range(4):
            response = self.create(input="What is the weather in Paris?", tools=TOOLS, tool_choice="required",
                                   temperature=1.0, max_output_tokens=600, extra_body={"seed": seed})
            self.assertEqual(response.status, "completed", response)
            calls = [item for item in response.output if item.type == "function_call"]
            self.assertGreaterEqual(len(calls), 1)
            for call in calls:
                self.assert_valid_call(call)
                names.add(call.name)
        self.assertTrue(names)
        named = self.create(input="What time is it?", tools=TOOLS, max_output_tokens=200,
                            tool_choice={"type": "function", "name": "get_time"})
        self.assertEqual([item.type for item in named.output], ["function_call"])
        self.assertEqual(named.output[0].name, "get_time")
        self.assert_valid_call(named.output[0])
        # Tools other than functions are refused, naming the field.
        with self.assertRaises(openai.BadRequestError) as raised:
            self.create(input="x", tools=[{"type": "web_search"}])
        self.assertEqual(raised.exception.body["param"], "tools[0].type")

    def test_forced_call_cut_by_max_output_tokens_is_an_incomplete_function_call(self):
        kwargs = dict(input="What time is it?", tools=TOOLS, max_output_tokens=3, temperature=0.0,
                      tool_choice={"type": "function", "name": "get_time"})
        whole = self.create(**kwargs)
        self.assertEqual(whole.status, "incomplete")
        self.assertEqual(whole.incomplete_details.reason, "max_output_tokens")
        self.assertEqual([(item.type, item.status) for item in whole.output], [("function_call", "incomplete")])
        self.assertEqual(whole.output[0].name, "get_time")
        self.assertTrue(whole.output[0].arguments.startswith("{"))
        events = list(self.create(stream=True, **kwargs))
        self.assertEqual(events[-1].type, "response.incomplete")
        streamed = events[-1].response.output
        self.assertEqual([(item.type, item.status, item.arguments) for item in streamed],
                         [("function_call", "incomplete", whole.output[0].arguments)])
        self.assertNotIn("response.output_text.delta", [event.type for event in events])

    def test_previous_response_id_chain_with_a_tool_result(self):
        first = self.create(input="What is the weather in Paris?", tools=TOOLS, tool_choice="required",
                            max_output_tokens=200, instructions="You are terse.")
        call = next(item for item in first.output if item.type == "function_call")
        self.assert_valid_call(call)
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 degrees and sunny"}
        second = self.create(previous_response_id=first.id, input=[result], tools=TOOLS, tool_choice="auto",
                             extra_body={"ignore_eos": True})
        self.assertEqual(second.previous_response_id, first.id)
        self.assertEqual(second.output[0].type, "message")
        # The stored conversation is what the chain renders: the same prompt and text as the items in full
        # (instructions are not carried over, as OpenAI).
        full = self.create(input=[{"role": "user", "content": "What is the weather in Paris?"},
                                  *[item.model_dump() for item in first.output], result],
                           tools=TOOLS, tool_choice="auto", extra_body={"ignore_eos": True})
        self.assertEqual(second.usage.input_tokens, full.usage.input_tokens)
        self.assertEqual(second.output_text, full.output_text)
        self.assertGreater(second.usage.input_tokens, first.usage.input_tokens)
        third = self.create(previous_response_id=second.id, input="Thanks. And tomorrow?", tools=TOOLS,
                            extra_body={"ignore_eos": True})
        self.assertGreater(third.usage.input_tokens, second.usage.input_tokens + 5)
        # The second turn's prompt starts the third's: served from the prefix cache.
        self.assertGreater(third.usage.input_tokens_details.cached_tokens, 0)
        # GET returns the stored response; DELETE removes it (then 404 both ways).
        fetched = self.client.responses.retrieve(second.id)
        self.assertEqual(fetched.id, second.id)
        self.assertEqual(fetched.output_text, second.output_text)
        self.client.responses.delete(second.id)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(second.id)
        with self.assertRaises(openai.NotFoundError) as raised:
            self.create(previous_response_id=second.id, input="again")
        self.assertEqual(raised.exception.body["code"], "previous_response_not_found")
        self.assertEqual(raised.exception.body["param"], "previous_response_id")
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.delete(second.id)

    def test_streamed_events(self):
        whole = self.create(input="Tell me a story", extra_body={"ignore_eos": True})
        events = list(self.create(input="Tell me a story", stream=True, extra_body={"ignore_eos": True}))
        types = [event.type for event in events]
        self.assertEqual([event.sequence_number for event in events], list(range(len(events))))
        deltas = [event for event in events if event.type == "response.output_text.delta"]
        self.assertGreaterEqual(len(deltas), 2)
        self.assertEqual(types, ["response.created", "response.in_progress", "response.output_item.added",
                                 "response.content_part.added"] + ["response.output_text.delta"] * len(deltas) +
                         ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"])
        self.assertEqual("".join(delta.delta for delta in deltas), whole.output_text)
        final = events[-1].response
        self.assertEqual(final.output_text, whole.output_text)
        self.assertEqual(final.usage.output_tokens, whole.usage.output_tokens)
        self.assertEqual(final.id, events[0].response.id)
        self.assertEqual(self.client.responses.retrieve(final.id).output_text, whole.output_text)
        # A forced call: the item, its argument deltas, then completed.
        kwargs = dict(input="What is the weather in Paris?", tools=TOOLS, tool_choice="required",
                      max_output_tokens=200)
        whole = self.create(**kwargs)
        events = list(self.create(stream=True, **kwargs))
        types = [event.type for event in events]
        self.assertEqual(types[:3], ["response.created", "response.in_progress", "response.output_item.added"])
        self.assertEqual(events[2].item.type, "function_call")
        self.assertEqual(types[-3:], ["response.function_call_arguments.done", "response.output_item.done",
                                      "response.completed"])
        arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
        whole_calls = [item for item in whole.output if item.type == "function_call"]
        streamed_calls = [item for item in events[-1].response.output if item.type == "function_call"]
        self.assertEqual([(c.name, c.arguments) for c in streamed_calls], [(c.name, c.arguments) for c in whole_calls])
        self.assertEqual(arguments, "".join(c.arguments for c in whole_calls))
        # Arguments stream as they are generated: several deltas per call.
        self.assertGreater(len([e for e in events if e.type == "response.function_call_arguments.delta"]),
                           len(whole_calls))
        # The client's stream helper assembles the same response (it needs response.completed: a forced text
        # that ends by itself).
        with self.client.responses.stream(model="tiny", input="Tell me a story", max_output_tokens=20,
                                          temperature=0.0,
                                          extra_body={"structured_outputs": {"regex": "once upon a time"}}) as stream:
            text = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
            helper_final = stream.get_final_response()
        self.assertEqual(text, "once upon a time")
        self.assertEqual(helper_final.status, "completed")
        self.assertEqual(helper_final.output_text, text)

    def test_store_eviction_and_store_false(self):
        ids = [self.create(input=f"turn {i}", max_output_tokens=2).id for i in range(STORE_ENTRIES + 1)]
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(ids[0])
        with self.assertRaises(openai.NotFoundError) as raised:
            self.create(previous_response_id=ids[0], input="next")
        self.assertEqual(raised.exception.body["code"], "previous_response_not_found")
        for response_id in ids[1:]:
            self.assertEqual(self.client.responses.retrieve(response_id).id, response_id)
        unstored = self.create(input="not kept", store=False, max_output_tokens=2)
        self.assertFalse(unstored.store)
        with self.assertRaises(openai.NotFoundError):
            self.client.responses.retrieve(unstored.id)
        with self.assertRaises(openai.NotFoundError):
            self.create(previous_response_id="resp_unknown", input="x")

    def test_text_format_json_schema_and_json_object(self):
        schema = {"type": "object",
                  "properties": {"reasoning": {"type": "string", "maxLength": 20},
                                 "answer": {"type": "integer", "minimum": 0, "maximum": 99}},
                  "required": ["reasoning", "answer"], "additionalProperties": False}
        for seed in range(4):
            response = self.create(input="What is 2 + 2?", max_output_tokens=200, temperature=1.0,
                                   text={"format": {"type": "json_schema", "name": "answer", "schema": schema,
                                                    "strict": True}},
                                   extra_body={"seed": seed})
            self.assertEqual(response.status, "completed")
            value = json.loads(response.output_text)
            jsonschema.validate(value, schema)
            self.assertEqual(list(value), ["reasoning", "answer"])  # the schema's member order
        self.assertEqual(response.text.format.type, "json_schema")
        response = self.create(input="Some JSON please", max_output_tokens=200,
                               text={"format": {"type": "json_object"}})
        self.assertIsInstance(json.loads(response.output_text), dict)

    def test_adapters_by_model(self):
        adapter = self.server.adapter_names[0]
        response = self.create(model=adapter, input="Hello there")
        self.assertEqual(response.model, adapter)
        with self.assertRaises(openai.NotFoundError) as raised:
            self.create(model="no-such-model", input="Hello there")
        self.assertEqual(raised.exception.body["code"], "model_not_found")
        # Workflow hints reach the chat path's reader: served, and a malformed one is refused naming it.
        hinted = self.create(input="Hello there", extra_body={"workflow": "w1", "agent": "planner"})
        self.assertEqual(hinted.output[0].type, "message")
        with self.assertRaises(openai.BadRequestError) as raised:
            self.create(input="Hello there", extra_body={"workflow": "w1", "fixed_prefix_tokens": -3})
        self.assertEqual(raised.exception.body["param"], "fixed_prefix_tokens")


if __name__ == "__main__":
    unittest.main()
