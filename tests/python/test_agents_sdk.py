"""The OpenAI Agents SDK with its defaults (the Responses API) against a real
`loom serve`: an agent with one function tool under tool_choice "required"
calls it with valid arguments, gets its result back and ends with a final
output; the same streamed (Runner.run_streamed) and through
OpenAIChatCompletionsModel; a handoff; output_type with and without a tool.
Skipped when `openai-agents` is not installed."""
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


    # ---- helpers for the tests below ----
    def sdk_client(self):
        client = openai.AsyncOpenAI(base_url=self.server.base_url + "/v1", api_key="unused", max_retries=0)
        agents.set_default_openai_client(client, use_for_tracing=False)
        agents.set_tracing_disabled(True)
        return client

    @staticmethod
    def settings(tool_choice=None, regex=None, max_tokens=200):
        extra = {"structured_outputs": {"regex": regex}} if regex else None
        return agents.ModelSettings(tool_choice=tool_choice, parallel_tool_calls=False if tool_choice else None,
                                    max_tokens=max_tokens, temperature=0.0, extra_body=extra)

    def weather_agent(self, calls, model="tiny"):
        @agents.function_tool
        def get_weather(city: Annotated[str, pydantic.Field(max_length=12)]) -> str:
            """Current weather in a city."""
            calls.append(city)
            return f"21 degrees and sunny in {city}"

        return agents.Agent(name="weather", instructions="Answer with the weather.", model=model, tools=[get_weather],
                            model_settings=self.settings("required", "It is sunny[.]"))

    def test_streamed_run_gives_the_same_turns(self):
        self.sdk_client()
        calls = []
        agent = self.weather_agent(calls)

        async def drain():
            streamed = agents.Runner.run_streamed(agent, "What is the weather in Oslo?", max_turns=4)
            kinds = []
            async for event in streamed.stream_events():
                kinds.append(event.type if event.type != "raw_response_event" else event.data.type)
            return streamed, kinds

        result, kinds = asyncio.run(drain())
        self.assertEqual(len(calls), 1)
        self.assertEqual(result.final_output, "It is sunny.")
        self.assertIn("response.function_call_arguments.delta", kinds)
        self.assertIn("response.output_text.delta", kinds)
        self.assertIn("run_item_stream_event", kinds)
        self.assertEqual(kinds.count("response.completed"), 2)

    def test_chat_completions_model(self):
        client = self.sdk_client()
        calls = []
        model = agents.OpenAIChatCompletionsModel(model="tiny", openai_client=client)
        result = asyncio.run(agents.Runner.run(self.weather_agent(calls, model=model), "Weather in Rome?", max_turns=4))
        self.assertEqual(len(calls), 1)
        self.assertEqual(result.final_output, "It is sunny.")
        self.assertEqual(len(result.raw_responses), 2)
        self.assertTrue(all(response.response_id is None for response in result.raw_responses))  # not /v1/responses

    def test_handoff_moves_the_run_to_the_other_agent(self):
        self.sdk_client()
        billing = agents.Agent(name="billing", instructions="Handle refunds.", model="tiny",
                               model_settings=self.settings(regex="Refund sent[.]"))
        triage = agents.Agent(name="triage", instructions="Route the customer.", model="tiny", handoffs=[billing],
                              model_settings=self.settings(agents.handoff(billing).tool_name))
        result = asyncio.run(agents.Runner.run(triage, "I want my money back.", max_turns=4))
        self.assertEqual(result.last_agent.name, "billing")
        self.assertEqual(result.final_output, "Refund sent.")
        self.assertTrue(any(item.type == "handoff_output_item" for item in result.new_items))

    class Verdict(pydantic.BaseModel):
        reasoning: Annotated[str, pydantic.Field(max_length=24)]
        score: Annotated[int, pydantic.Field(ge=0, le=10)]

    def test_output_type_without_tools(self):
        self.sdk_client()
        agent = agents.Agent(name="judge", instructions="Judge the answer.", model="tiny", output_type=self.Verdict,
                             model_settings=self.settings(max_tokens=120))
        result = asyncio.run(agents.Runner.run(agent, "Is 2 + 2 = 4?", max_turns=2))
        self.assertIsInstance(result.final_output, self.Verdict)
        self.assertLessEqual(len(result.final_output.reasoning), 24)
        self.assertTrue(0 <= result.final_output.score <= 10)

    def test_output_type_after_a_forced_tool(self):
        self.sdk_client()
        calls = []
        agent = self.weather_agent(calls).clone(output_type=self.Verdict,
                                                model_settings=self.settings("required", max_tokens=120))
        result = asyncio.run(agents.Runner.run(agent, "Is it warm in Paris?", max_turns=4))
        self.assertEqual(len(calls), 1)
        self.assertIsInstance(result.final_output, self.Verdict)
        self.assertTrue(0 <= result.final_output.score <= 10)


if __name__ == "__main__":
    unittest.main()
