"""Structured outputs against a real `loom serve` on a random-weight model with
the `openai` client: response_format json_schema on 100 seeds at temperature 1
(every output validates with `jsonschema`), json_object, vLLM's
structured_outputs / guided_* fields (regex, choice, grammar), unsupported
features -> 400 naming them, and the server keeps serving."""
import json
import os
import re
import sys
import unittest
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402

try:
    import jsonschema
except ImportError:  # pragma: no cover
    print("jsonschema is not installed (scripts/python-requirements.txt)")
    sys.exit(77)

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer"},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "note": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "^[a-z]{1,5}$"}]},
    },
    "required": ["name", "age", "ok", "color"],
    "additionalProperties": False,
}
MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]


class StructuredOutputsTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--max-context-tokens", "2048"]
    SERVER_KWARGS = {"num_adapters": 1}

    def chat(self, **kwargs):
        return self.client.chat.completions.create(model="tiny", messages=MESSAGES, **kwargs)

    def test_json_schema_100_seeds_validate(self):
        response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}

        def one(seed):
            response = self.chat(response_format=response_format, temperature=1.0, seed=seed, max_tokens=400)
            return response.choices[0]

        with ThreadPoolExecutor(max_workers=16) as pool:
            choices = list(pool.map(one, range(100)))
        for seed, choice in enumerate(choices):
            # Enough tokens for this schema: every output must be complete and valid.
            self.assertEqual(choice.finish_reason, "stop", (seed, choice.message.content))
            value = json.loads(choice.message.content)
            jsonschema.validate(value, SCHEMA)
        self.assertGreater(len({choice.message.content for choice in choices}), 10)  # really sampled

    def test_json_object(self):
        for seed in range(5):
            choice = self.chat(response_format={"type": "json_object"}, temperature=1.0, seed=seed,
                               max_tokens=300).choices[0]
            if choice.finish_reason == "stop":
                self.assertIsInstance(json.loads(choice.message.content), dict)
            else:  # cut by max_tokens: a prefix of an object
                self.assertEqual(choice.finish_reason, "length")
                self.assertTrue(choice.message.content.startswith("{"))

    def test_regex_choice_and_grammar(self):
        pattern = r"(yes|no)-[0-9]{2,4}"
        for seed in range(10):
            text = self.client.completions.create(model="tiny", prompt="Answer:", max_tokens=50, temperature=1.0,
                                                  seed=seed, extra_body={"structured_outputs": {"regex": pattern}}
                                                  ).choices[0]
            self.assertEqual(text.finish_reason, "stop")
            self.assertRegex(text.text, "^" + pattern + "$")
            legacy = self.client.completions.create(model="tiny", prompt="Answer:", max_tokens=50, temperature=1.0,
                                                    seed=seed, extra_body={"guided_regex": pattern}).choices[0]
            self.assertRegex(legacy.text, "^" + pattern + "$")
            choice = self.chat(temperature=1.0, seed=seed, max_tokens=20,
                               extra_body={"guided_choice": ["alpha", "beta", "gamma delta"]}).choices[0]
            self.assertIn(choice.message.content, ["alpha", "beta", "gamma delta"])
            self.assertEqual(choice.finish_reason, "stop")
            grammar = 'root ::= "[" item ("," item)* "]"\nitem ::= [a-c] | "x" [0-9]'
            text = self.client.completions.create(model="tiny", prompt="List:", max_tokens=60, temperature=1.0,
                                                  seed=seed, extra_body={"guided_grammar": grammar}).choices[0]
            if text.finish_reason == "stop":
                self.assertRegex(text.text, r"^\[([a-c]|x[0-9])(,([a-c]|x[0-9]))*\]$")

    def test_guided_json_and_streaming(self):
        schema = {"type": "object", "properties": {"v": {"enum": [1, 2, 3]}}, "required": ["v"]}
        stream = self.client.completions.create(model="tiny", prompt="x", max_tokens=30, temperature=1.0, seed=3,
                                                stream=True, extra_body={"guided_json": schema})
        text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        jsonschema.validate(json.loads(text), schema)

    def assert_400(self, fragment_param, fragment_message, **kwargs):
        with self.assertRaises(openai.BadRequestError) as caught:
            self.chat(max_tokens=5, **kwargs)
        error = caught.exception.body
        self.assertIn(fragment_param, error.get("param") or "", error)
        self.assertIn(fragment_message, error["message"], error)

    def test_unsupported_and_bad_requests_are_400_naming_them(self):
        # What no grammar enforces: a 400 under strict; without it, served and named in a header.
        bad_schema = {"type": "object", "properties": {"age": {"type": "integer", "not": {"const": 3}}}}
        self.assert_400("response_format.json_schema.schema", "'not'",
                        response_format={"type": "json_schema",
                                         "json_schema": {"name": "x", "schema": bad_schema, "strict": True}})
        raw = self.client.chat.completions.with_raw_response.create(
            model="tiny", messages=MESSAGES, max_tokens=20,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": bad_schema}})
        self.assertEqual(raw.headers.get("x-loom-schema-unenforced"), "not")
        self.assert_400("guided_regex", "lookahead", extra_body={"guided_regex": "(?=a)b"})
        self.assert_400("structured_outputs.grammar", "line 1", extra_body={"structured_outputs": {"grammar": "root ::= ["}})
        self.assert_400("guided_json", "only one", response_format={"type": "json_object"},
                        extra_body={"guided_json": {"type": "object"}})
        self.assert_400("response_format.type", "json_schema", response_format={"type": "xml"})
        self.assert_400("structured_outputs.foo", "not supported", extra_body={"structured_outputs": {"foo": 1}})
        self.assert_400("guided_choice", "non-empty", extra_body={"guided_choice": []})
        # Still serving, and a plain text response_format is no constraint.
        response = self.chat(max_tokens=4, response_format={"type": "text"}, temperature=0.0,
                             extra_body={"ignore_eos": True})
        self.assertEqual(response.usage.completion_tokens, 4)


if __name__ == "__main__":
    unittest.main()
