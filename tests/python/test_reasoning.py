"""--reasoning-parser against a real `loom serve` (random tiny model) with the
openai client: a DeepSeek-R1-style template opens the think block in the
prompt, so a random output (which never writes </think>) is all reasoning:
reasoning_content and reasoning on the message, null content, the same text in
the stream's deltas, a reasoning item on /v1/responses; a structured-output
grammar waits for </think> (the thinking stays free text). A Qwen3 template
with enable_thinking false closes the think block: all answer, and the grammar
applies from the first token. Usage counts the thinking's tokens
(completion_tokens_details / output_tokens_details.reasoning_tokens). Without
the flag (auto), a thinking template served with a vocabulary that has <think>
and </think> picks the parser (a tiny model with two tokens renamed); the tiny
model's own vocabulary has none: no parser."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
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
        # All of it is thinking.
        self.assertEqual(whole.usage.completion_tokens, 12)
        self.assertEqual(whole.usage.completion_tokens_details.reasoning_tokens, 12)

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
        self.assertEqual(response.usage.output_tokens_details.reasoning_tokens, 12)
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
        self.assertEqual(whole.usage.completion_tokens_details.reasoning_tokens, 0)
        thinking = self.client.chat.completions.create(model="tiny", messages=USER, max_tokens=8, temperature=0.0)
        self.assertIsNone(thinking.choices[0].message.content)  # thinking on (the default): no </think> came
        self.assertTrue(thinking.choices[0].message.reasoning_content)


class AutoParserTest(loom_server.ServerTestCase):
    """No --reasoning-parser: auto. The Qwen3 template marks thinking, but the tiny model's vocabulary has no
    <think> / </think> tokens, so no parser is picked: the output is all content, no reasoning tokens."""
    SERVER_ARGS = ["--chat-template", os.path.join(FIXTURES, "qwen3.jinja")]
    SERVER_KWARGS = {"num_adapters": 1}

    def test_no_think_tokens_no_parser(self):
        whole = self.client.chat.completions.create(model="tiny", messages=USER, max_tokens=8, temperature=0.0,
                                                    extra_body={"ignore_eos": True})
        self.assertTrue(whole.choices[0].message.content)
        self.assertIsNone(getattr(whole.choices[0].message, "reasoning_content", None))
        self.assertEqual(whole.usage.completion_tokens_details.reasoning_tokens, 0)
        self.assertIn("reasoning: 'none' parser (--reasoning-parser auto: the vocabulary has no <think> and </think> "
                      "tokens)", self.server.read_log())


def think_vocabulary_model(directory):
    """A tiny model whose vocabulary has <think> and </think>: two of its Llama 3 header tokens renamed (the
    ChatML-style templates these tests serve never use them)."""
    model = os.path.join(directory, "model")
    subprocess.run([loom_server.loom_binary(), "make-model", "--arch", "llama", "--preset", "tiny", "--adapters", "1",
                    "--out", model], check=True, stdout=subprocess.DEVNULL)
    path = os.path.join(model, "tokenizer.json")
    with open(path) as file:
        tokenizer = json.load(file)
    renames = {"<|start_header_id|>": "<think>", "<|end_header_id|>": "</think>"}
    for token in tokenizer["added_tokens"]:
        if token["content"] in renames:
            token["content"] = renames[token["content"]]
            token["special"] = False
    vocab = tokenizer["model"]["vocab"]
    for old, new in renames.items():
        vocab[new] = vocab.pop(old)
    with open(path, "w") as file:
        json.dump(tokenizer, file)
    return model


class AutoParserPickedTest(loom_server.ServerTestCase):
    """No --reasoning-parser, a DeepSeek-R1-style template (its prompt opens the think block) and a vocabulary
    with the think tokens: auto picks deepseek_r1, logs it, and the output is reasoning."""
    SERVER_ARGS = ["--chat-template", os.path.join(FIXTURES, "deepseek_r1.jinja")]

    @classmethod
    def setUpClass(cls):
        cls.model_home = tempfile.mkdtemp(prefix="loom-think-")
        cls.SERVER_KWARGS = {"num_adapters": 1, "model_dir": think_vocabulary_model(cls.model_home)}
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        try:
            super().tearDownClass()
        finally:
            shutil.rmtree(cls.model_home, ignore_errors=True)

    def test_deepseek_r1_picked(self):
        self.assertIn("reasoning: 'deepseek_r1' parser (--reasoning-parser auto: the chat template's generation prompt "
                      "opens a think block)", self.server.read_log())
        whole = self.client.chat.completions.create(model="tiny", messages=USER, max_tokens=12, temperature=0.0,
                                                    extra_body={"ignore_eos": True})
        message = whole.choices[0].message
        self.assertIsNone(message.content)
        self.assertTrue(message.reasoning_content)
        self.assertEqual(whole.usage.completion_tokens_details.reasoning_tokens, 12)


if __name__ == "__main__":
    unittest.main()
