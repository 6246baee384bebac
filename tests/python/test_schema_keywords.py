"""JSON-schema keywords that real tools carry (Pydantic's ge/le/gt/lt, set[...],
date, HttpUrl) against a real `loom serve` on a random-weight model, with the
`openai` client: as response_format and as a forced tool (named and
"required"), over many seeds at temperature 1, every output validates with
`jsonschema` (but for the keywords the server names in x-loom-schema-unenforced:
only uniqueItems of a set[str], whose strings no grammar tells apart) and keeps
the schema's member order; a forced tool with response_format is served and the
tool governs. URLs (format uri beside maxLength, HttpUrl's 2083) are enforced
without the header; a bound of 400 is checked to the end of every output, HttpUrl's
as a prefix (a random model's URL does not end within a small token budget)."""
import json
import os
import re
import sys
import unittest
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from enum import Enum
from typing import Annotated

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402,F401

try:
    import jsonschema
    from pydantic import AnyUrl, BaseModel, Field, HttpUrl, UrlConstraints
except ImportError:  # pragma: no cover
    print("jsonschema / pydantic are not installed (scripts/python-requirements.txt)")
    sys.exit(77)

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "chat", "qwen3.jinja")
NUM_SEEDS = 100


class Unit(str, Enum):
    C = "C"
    F = "F"
    K = "K"


class Report(BaseModel):  # "reasoning" first on purpose: sorted keys would put it after "count"
    reasoning: Annotated[str, Field(max_length=10)]
    score: int = Field(ge=0, le=100)
    ratio: float = Field(gt=0, le=1)
    count: int = Field(gt=-5, lt=5)
    tags: set[Annotated[str, Field(max_length=4)]] = Field(max_length=3)
    units: set[Unit]
    day: date


class Codes(BaseModel):  # 21 and 12 values: more than 2^n states take, the items come in ascending / enum order
    codes: set[Annotated[int, Field(ge=0, le=20)]] = Field(max_length=4)
    letters: set[str] = Field(json_schema_extra={"items": {"enum": list("abcdefghijkl")}})


class Link(BaseModel):
    site: HttpUrl


class ShortLink(BaseModel):
    site: Annotated[AnyUrl, UrlConstraints(max_length=400)]


SCHEMA = Report.model_json_schema()
ORDER = list(SCHEMA["properties"])
# Strings distinct from each other: no grammar here expresses it.
EXPECTED_UNENFORCED = {"uniqueItems"}
DATE = re.compile(r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])")
URI = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:[A-Za-z0-9\-._~!$&'()*+,;=:@/?#%\[\]]*")
MESSAGES = [{"role": "user", "content": "Write the report."}]
TOOL = {"type": "function", "function": {"name": "report", "description": "File the report", "parameters": SCHEMA}}
NAMED = {"type": "function", "function": {"name": "report"}}


class SchemaKeywordsTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--chat-template", TEMPLATE, "--tool-call-parser", "auto", "--max-context-tokens", "2048"]
    SERVER_KWARGS = {"num_adapters": 1}

    def raw_chat(self, seed, **kwargs):
        raw = self.client.chat.completions.with_raw_response.create(
            model="tiny", messages=MESSAGES, temperature=1.0, seed=seed, max_tokens=500, **kwargs)
        return raw.parse().choices[0], raw.headers.get("x-loom-schema-unenforced")

    def check_value(self, value, unenforced, context):
        """Validates (tolerating only what the header names) and checks member order and the uri."""
        listed = set(unenforced.split(", ")) if unenforced else set()
        self.assertEqual(listed, EXPECTED_UNENFORCED, context)
        errors = [error for error in jsonschema.Draft202012Validator(SCHEMA).iter_errors(value)
                  if error.validator not in listed]
        self.assertEqual([error.message for error in errors], [], (context, value))
        self.assertEqual(list(value), ORDER, (context, value))
        self.assertRegex(value["day"], DATE)

    def run_seeds(self, one, count):
        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(one, range(count)))

    def test_response_format(self):
        response_format = {"type": "json_schema", "json_schema": {"name": "report", "schema": SCHEMA}}
        results = self.run_seeds(lambda seed: self.raw_chat(seed, response_format=response_format), NUM_SEEDS)
        for seed, (choice, unenforced) in enumerate(results):
            self.assertEqual(choice.finish_reason, "stop", (seed, choice.message.content))
            self.check_value(json.loads(choice.message.content), unenforced, seed)
        self.assertGreater(len({choice.message.content for choice, _ in results}), NUM_SEEDS // 2)

    def test_forced_tools(self):
        def named(seed):
            return self.raw_chat(seed, tools=[TOOL], tool_choice=NAMED)

        def required(seed):
            return self.raw_chat(1000 + seed, tools=[TOOL], tool_choice="required")

        for mode, one in (("named", named), ("required", required)):
            for seed, (choice, unenforced) in enumerate(self.run_seeds(one, NUM_SEEDS // 2)):
                calls = choice.message.tool_calls
                self.assertTrue(calls, (mode, seed, choice))
                for call in calls:
                    self.assertEqual(call.function.name, "report")
                    self.check_value(json.loads(call.function.arguments), unenforced, (mode, seed))

    def test_forced_tool_with_response_format_is_served(self):
        response_format = {"type": "json_schema",
                           "json_schema": {"name": "answer", "schema": {"type": "object",
                                                                        "properties": {"answer": {"type": "string"}},
                                                                        "required": ["answer"]}}}
        for tool_choice in (NAMED, "required"):
            choice, unenforced = self.raw_chat(7, tools=[TOOL], tool_choice=tool_choice,
                                               response_format=response_format)
            self.assertTrue(choice.message.tool_calls, choice)
            self.check_value(json.loads(choice.message.tool_calls[0].function.arguments), unenforced, tool_choice)

    def test_sets_of_many_values_are_enforced(self):
        schema = Codes.model_json_schema()
        response_format = {"type": "json_schema", "json_schema": {"name": "codes", "schema": schema, "strict": True}}

        def one(seed):
            return self.client.chat.completions.with_raw_response.create(
                model="tiny", messages=MESSAGES, temperature=1.0, seed=seed, max_tokens=300,
                response_format=response_format)

        for seed, raw in enumerate(self.run_seeds(one, 30)):
            self.assertIsNone(raw.headers.get("x-loom-schema-unenforced"))
            choice = raw.parse().choices[0]
            self.assertEqual(choice.finish_reason, "stop", (seed, choice.message.content))
            value = json.loads(choice.message.content)
            jsonschema.validate(value, schema)
            self.assertEqual(value["codes"], sorted(value["codes"]))

    def test_url_length_is_enforced(self):
        schema = ShortLink.model_json_schema()
        self.assertEqual(schema["properties"]["site"]["format"], "uri")
        response_format = {"type": "json_schema", "json_schema": {"name": "link", "schema": schema, "strict": True}}

        def one(seed):
            return self.client.chat.completions.with_raw_response.create(
                model="tiny", messages=MESSAGES, temperature=1.0, seed=seed, max_tokens=450,
                response_format=response_format)

        for seed, raw in enumerate(self.run_seeds(one, 12)):
            self.assertIsNone(raw.headers.get("x-loom-schema-unenforced"))
            choice = raw.parse().choices[0]
            self.assertEqual(choice.finish_reason, "stop", (seed, choice.message.content))
            value = json.loads(choice.message.content)
            jsonschema.validate(value, schema)
            self.assertLessEqual(len(value["site"]), 400)
            self.assertRegex(value["site"], URI)

    def test_http_url_is_served_without_the_header(self):
        response_format = {"type": "json_schema", "json_schema": {"name": "link", "schema": Link.model_json_schema()}}
        for seed in range(3):
            raw = self.client.chat.completions.with_raw_response.create(
                model="tiny", messages=MESSAGES, temperature=1.0, seed=seed, max_tokens=40,
                response_format=response_format)
            self.assertIsNone(raw.headers.get("x-loom-schema-unenforced"))
            content = raw.parse().choices[0].message.content
            self.assertTrue(content.startswith('{"site":"'), content)
            # Cut by max_tokens: a prefix of a URI (the scheme's ":" may not have come yet).
            self.assertRegex(content[len('{"site":"'):].split('"')[0], r"^[A-Za-z][A-Za-z0-9+.\-]*(:[^\s\"\\]*)?$")

    def test_strict_names_what_no_grammar_enforces(self):
        strict_tool = {"type": "function", "function": dict(TOOL["function"], strict=True)}
        with self.assertRaises(openai.BadRequestError) as caught:
            self.raw_chat(0, tools=[strict_tool], tool_choice=NAMED)
        self.assertEqual(caught.exception.body.get("param"), "tools[0].function.parameters")
        self.assertIn("'uniqueItems'", caught.exception.body["message"])


if __name__ == "__main__":
    unittest.main()
