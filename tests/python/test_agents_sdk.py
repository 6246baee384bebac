"""The OpenAI Agents SDK with its defaults (the Responses API) against a real
`loom serve`: an agent with one function tool under tool_choice "required"
calls it with valid arguments, gets its result back and ends with a final
output. Skipped when `openai-agents` is not installed."""
import asyncio
import json
import os
import sys
import unittest
from typing import Annotated

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
try:
    import agents
except ImportError:  # pragma: no cover
    print("SKIPPED: openai-agents is not installed (scripts/python-requirements.txt)")
    sys.exit(loom_server.SKIP_EXIT_CODE)
import openai  # noqa: E402
import pydantic  # noqa: E402

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "chat", "qwen3.jinja")


class AgentsSdkTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--chat-template", TEMPLATE, "--tool-call-parser", "auto", "--max-context-tokens", "4096"]
    SERVER_KWARGS = {"num_adapters": 1}

    def test_function_tool_through_the_responses_api(self):
        calls = []

        @agents.function_tool
        def get_weather(city: Annotated[str, pydantic.Field(max_length=12)]) -> str:
            """Current weather in a city."""
            calls.append(city)
            return f"21 degrees and sunny in {city}"

        client = openai.AsyncOpenAI(base_url=self.server.base_url + "/v1", api_key="unused", max_retries=0)
        agents.set_default_openai_client(client, use_for_tracing=False)
        agents.set_tracing_disabled(True)
        agent = agents.Agent(name="weather", instructions="Answer with the weather.", model="tiny", tools=[get_weather],
                             model_settings=agents.ModelSettings(
                                 tool_choice="required", parallel_tool_calls=False, max_tokens=200, temperature=0.0,
                                 # The answer turn (tool_choice reset to auto after the call) is forced to end by
                                 # itself, as a random model would not; a forced tool call ignores it (vLLM's rule).
                                 extra_body={"structured_outputs": {"regex": "It is sunny[.]"}}))
        result = asyncio.run(agents.Runner.run(agent, "What is the weather in Paris?", max_turns=4))
        self.assertEqual(len(calls), 1)  # parallel_tool_calls false: one call
        self.assertIsInstance(calls[0], str)
        call_items = [item for item in result.new_items if item.type == "tool_call_item"]
        output_items = [item for item in result.new_items if item.type == "tool_call_output_item"]
        self.assertEqual(len(call_items), 1)
        self.assertEqual(json.loads(call_items[0].raw_item.arguments), {"city": calls[0]})
        self.assertEqual(output_items[0].output, f"21 degrees and sunny in {calls[0]}")
        self.assertEqual(result.final_output, "It is sunny.")
        # Two model turns, both over /v1/responses (the SDK's default API; chat completions leave response_id None).
        self.assertEqual(len(result.raw_responses), 2)
        self.assertTrue(all(response.response_id.startswith("resp_") for response in result.raw_responses))


if __name__ == "__main__":
    unittest.main()
