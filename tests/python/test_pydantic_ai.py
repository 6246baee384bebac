"""pydantic-ai, unmodified but for base_url/api_key, against a real `loom serve`
(random tiny model, a Qwen3 template with hermes tool calls): a tool output
(output_type) beside a function tool, NativeOutput (response_format
json_schema), and OpenAIResponsesModel (/v1/responses). Skipped when
pydantic-ai-slim[openai] is not installed."""
import asyncio
import os
import sys
import unittest
from typing import Annotated

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
try:
    from pydantic_ai import Agent, NativeOutput, RunContext
    from pydantic_ai.messages import ToolCallPart
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider
except ImportError:  # pragma: no cover
    print("SKIPPED: pydantic-ai-slim[openai] is not installed (scripts/python-requirements.txt)")
    sys.exit(loom_server.SKIP_EXIT_CODE)
from pydantic import BaseModel, Field  # noqa: E402

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "chat", "qwen3.jinja")
SETTINGS = {"temperature": 0.0, "max_tokens": 120}


class Forecast(BaseModel):  # "summary" first: the output keeps the schema's order
    summary: Annotated[str, Field(max_length=12)]
    degrees: int = Field(ge=-50, le=50)


def tool_calls(result):
    return [part for message in result.all_messages() for part in message.parts if isinstance(part, ToolCallPart)]


class PydanticAiTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--chat-template", TEMPLATE, "--tool-call-parser", "auto", "--max-context-tokens", "4096"]
    SERVER_KWARGS = {"num_adapters": 1}

    def provider(self):
        return OpenAIProvider(base_url=self.server.base_url + "/v1", api_key="unused")

    def test_tool_output_beside_a_function_tool(self):
        calls = []

        def settings(ctx: RunContext):
            # The first turn names the function tool (a random model would pick any); later turns leave
            # pydantic-ai's default, which forces its output tool (text output is not allowed).
            return {**SETTINGS, "parallel_tool_calls": False, **({} if calls else {"tool_choice": ["weather"]})}

        agent = Agent(OpenAIChatModel("tiny", provider=self.provider()), output_type=Forecast, model_settings=settings)

        @agent.tool_plain
        def weather(city: Annotated[str, Field(max_length=10)]) -> str:
            """The weather in a city."""
            calls.append(city)
            return f"sunny in {city}"

        result = agent.run_sync("Forecast for Paris?")
        self.assertIsInstance(result.output, Forecast)
        self.assertTrue(-50 <= result.output.degrees <= 50)
        self.assertEqual([part.tool_name for part in tool_calls(result)], ["weather", "final_result"])
        self.assertEqual(len(calls), 1)
        self.assertLessEqual(len(calls[0]), 10)

    def test_native_output(self):
        agent = Agent(OpenAIChatModel("tiny", provider=self.provider()), output_type=NativeOutput(Forecast),
                      model_settings=SETTINGS)
        result = agent.run_sync("Forecast for Oslo?")
        self.assertIsInstance(result.output, Forecast)
        self.assertEqual(tool_calls(result), [])
        text = result.all_messages()[-1].parts[0].content
        self.assertLess(text.index('"summary"'), text.index('"degrees"'))

    def test_responses_model(self):
        model = OpenAIResponsesModel("tiny", provider=self.provider())
        agent = Agent(model, output_type=NativeOutput(Forecast), model_settings=SETTINGS)
        result = asyncio.run(agent.run("Forecast for Rome?"))
        self.assertIsInstance(result.output, Forecast)
        self.assertTrue(result.all_messages()[-1].provider_response_id.startswith("resp_"))


if __name__ == "__main__":
    unittest.main()
