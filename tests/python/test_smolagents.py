"""smolagents' ToolCallingAgent, unmodified but for api_base/api_key, against a
real `loom serve` (random tiny model, a Qwen3 template with hermes tool calls):
every step is a forced tool call (smolagents sends tool_choice "required")
whose arguments parse and reach the tool, and the run ends with smolagents'
final-answer request after max_steps. Skipped when smolagents is not installed."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
try:
    from smolagents import OpenAIServerModel, Tool, ToolCallingAgent
    from smolagents.memory import ActionStep
    from smolagents.utils import AgentMaxStepsError
except ImportError:  # pragma: no cover
    print("SKIPPED: smolagents is not installed (scripts/python-requirements.txt)")
    sys.exit(loom_server.SKIP_EXIT_CODE)

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "chat", "qwen3.jinja")


class Weather(Tool):
    name = "weather"
    description = "The weather in a city."
    inputs = {"city": {"type": "string", "description": "the city"}}
    output_type = "string"

    def __init__(self):
        super().__init__()
        self.cities = []

    def forward(self, city):
        self.cities.append(city)
        return f"sunny in {city}"


class SmolagentsTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--chat-template", TEMPLATE, "--tool-call-parser", "auto", "--max-context-tokens", "4096"]
    SERVER_KWARGS = {"num_adapters": 1}

    def test_tool_calling_agent(self):
        def first_token(text):
            status, _, body = self.server.request("POST", "/tokenize", {"model": "tiny", "prompt": text,
                                                                       "add_special_tokens": False})
            self.assertEqual(status, 200, body)
            return str(loom_server.json.loads(body)["tokens"][0])

        # A random model picks a tool by chance: the weather tool's name is favoured, so every step calls
        # it and smolagents asks for the final answer after max_steps; and strings end at once (the closing
        # quote favoured; the grammar still decides where one may stand), as a random one would not within
        # a token budget. One call per step (parallel_tool_calls false, passed through by smolagents): a random
        # model may otherwise start a second call that max_tokens cuts short, and whether it does depends on
        # the machine's float rounding.
        model = OpenAIServerModel(model_id="tiny", api_base=self.server.base_url + "/v1", api_key="unused",
                                  temperature=0.0, max_tokens=60, parallel_tool_calls=False,
                                  logit_bias={first_token("weather"): 20, first_token('"'): 40})
        weather = Weather()
        agent = ToolCallingAgent(tools=[weather], model=model, max_steps=2, verbosity_level=0)
        answer = agent.run("What is the weather in Paris?")
        steps = [step for step in agent.memory.steps if isinstance(step, ActionStep)]
        # max_steps steps of one call each, then the step whose final answer smolagents asked for itself.
        self.assertEqual(len(steps), 3, steps)
        for step in steps[:2]:
            self.assertIsNone(step.error, step.error)
            self.assertEqual(len(step.tool_calls or []), 1, step)
            self.assertIsInstance(step.tool_calls[0].arguments, dict, step.tool_calls[0].arguments)
        self.assertIsInstance(steps[-1].error, AgentMaxStepsError)
        names = [call.name for step in steps for call in step.tool_calls or []]
        self.assertEqual(names, ["weather", "weather"])
        self.assertEqual(weather.cities, [call.arguments["city"] for step in steps for call in step.tool_calls or []])
        self.assertIsInstance(answer, str)  # after max_steps: smolagents' own final-answer request


if __name__ == "__main__":
    unittest.main()
