"""--reasoning-parser against a real `loom serve` (random tiny model) with the
openai client: a DeepSeek-R1-style template opens the think block in the
prompt, so a random output (which never writes </think>) is all reasoning:
reasoning_content and reasoning on the message, null content, the same text in
the stream's deltas, a reasoning item on /v1/responses; a structured-output
grammar waits for </think> (the thinking stays free text). A Qwen3 template
with enable_thinking false closes the think block: all answer, and the grammar
applies from the first token."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "chat")
USER = [{"role": "user", "content": "Is the sky blue?"}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 8}}, "required": ["answer"],
          "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}


class DeepSeekR1ReasoningTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--chat-template", os.path.join(FIXTURES, "deepseek_r1.jinja"), "--reasoning-parser", "deepseek_r1"]
    SERVER_KWARGS = {"num_adapters": 1}

    def test_thinking_is_reasoning_content(self):
        whole = self.client.chat.completions.create(model="tiny", messages=USER, max_tokens=12, temperature=0.0,
                                                    extra_body={"ignore_eos": True})
        message = whole.choices[0].message
        self.assertIsNone(message.content)
        self.assertTrue(message.reasoning_content)
        self.assertEqual(message.reasoning, message.reasoning_content)
        self.assertEqual(whole.choices[0].finish_reason, "length")

        reasoning = ""
        for chunk in self.client.chat.completions.create(model="tiny", messages=USER, max_tokens=12, temperature=0.0,
                                                         stream=True, extra_body={"ignore_eos": True}):
            if chunk.choices:
                delta = chunk.choices[0].delta
                self.assertIsNone(delta.content or None)
                reasoning += getattr(delta, "reasoning_content", None) or ""
        self.assertEqual(reasoning, message.reasoning_content)

    def test_grammar_waits_for_the_end_of_the_thinking(self):
        free = self.client.chat.completions.create(model="tiny", messages=USER, max_tokens=12, temperature=0.0,
                                                   extra_body={"ignore_eos": True})
        gated = self.client.chat.completions.create(model="tiny", messages=USER, max_tokens=12, temperature=0.0,
                                                    response_format=FORMAT, extra_body={"ignore_eos": True})
        # No </think> yet: the grammar has not started, the thinking is the free output.
        self.assertEqual(gated.choices[0].message.reasoning_content, free.choices[0].message.reasoning_content)
        self.assertIsNone(gated.choices[0].message.content)

    def test_responses_api_reasoning_item(self):
        response = self.client.responses.create(model="tiny", input="Is the sky blue?", max_output_tokens=12,
                                                temperature=0.0, extra_body={"ignore_eos": True})
        self.assertEqual(response.status, "incomplete")
        self.assertEqual([item.type for item in response.output], ["reasoning"])
        self.assertTrue(response.output[0].content[0].text)
        events = list(self.client.responses.create(model="tiny", input="Is the sky blue?", max_output_tokens=12,
                                                   temperature=0.0, stream=True, extra_body={"ignore_eos": True}))
        deltas = "".join(event.delta for event in events if event.type == "response.reasoning_text.delta")
        self.assertEqual(deltas, response.output[0].content[0].text)


class Qwen3ThinkingOffTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--chat-template", os.path.join(FIXTURES, "qwen3.jinja"), "--reasoning-parser", "qwen3"]
    SERVER_KWARGS = {"num_adapters": 1}

    def test_enable_thinking_false_is_all_answer_and_constrained_from_the_start(self):
        body = {"chat_template_kwargs": {"enable_thinking": False}}
        whole = self.client.chat.completions.create(model="tiny", messages=USER, max_tokens=60, temperature=0.0,
                                                    response_format=FORMAT, extra_body=body)
        message = whole.choices[0].message
        self.assertIsNone(message.reasoning_content)
        self.assertEqual(list(json.loads(message.content)), ["answer"])
        thinking = self.client.chat.completions.create(model="tiny", messages=USER, max_tokens=8, temperature=0.0)
        self.assertIsNone(thinking.choices[0].message.content)  # thinking on (the default): no </think> came
        self.assertTrue(thinking.choices[0].message.reasoning_content)


if __name__ == "__main__":
    unittest.main()
