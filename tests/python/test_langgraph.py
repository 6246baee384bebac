"""LangGraph with langchain-openai, unmodified but for base_url/api_key, against
a real `loom serve` (random tiny model, a Qwen3 template with hermes tool
calls): create_react_agent with a forced tool, with_structured_output by
json_schema and by function calling, and streamed tool-call chunks that merge
into one call. Skipped when langgraph / langchain-openai are not installed."""
import os
import sys
import unittest
import warnings
from typing import Annotated

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
try:
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent
except ImportError:  # pragma: no cover
    print("SKIPPED: langgraph / langchain-openai are not installed (scripts/python-requirements.txt)")
    sys.exit(loom_server.SKIP_EXIT_CODE)
from pydantic import BaseModel, Field  # noqa: E402

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "chat", "qwen3.jinja")


class Verdict(BaseModel):  # "reasoning" first: the output keeps the schema's order
    reasoning: Annotated[str, Field(max_length=12)]
    score: int = Field(ge=0, le=10)


CALLS = []


@tool(return_direct=True)
def lookup(city: Annotated[str, Field(max_length=10)]) -> str:
    """The weather in a city."""
    CALLS.append(city)
    return f"sunny in {city}"


class LangGraphTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--chat-template", TEMPLATE, "--tool-call-parser", "auto", "--max-context-tokens", "4096"]
    SERVER_KWARGS = {"num_adapters": 1}

    def model(self, **kwargs):
        return ChatOpenAI(model="tiny", base_url=self.server.base_url + "/v1", api_key="unused", max_retries=0,
                          temperature=0.0, max_tokens=120, **kwargs)

    def test_react_agent_with_a_forced_tool(self):
        CALLS.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # create_react_agent moves to langchain.agents
            agent = create_react_agent(self.model().bind_tools([lookup], tool_choice="required"), [lookup])
        result = agent.invoke({"messages": [("user", "Weather in Paris?")]})
        messages = result["messages"]
        calls = [call for message in messages if isinstance(message, AIMessage) for call in message.tool_calls]
        self.assertEqual(len(calls), 1, messages)
        self.assertEqual(calls[0]["name"], "lookup")
        self.assertEqual(CALLS, [calls[0]["args"]["city"]])
        self.assertLessEqual(len(CALLS[0]), 10)
        self.assertIsInstance(messages[-1], ToolMessage)  # return_direct: the tool's answer ends the run
        self.assertEqual(messages[-1].content, f"sunny in {CALLS[0]}")

    def test_structured_output_by_json_schema_and_function_calling(self):
        for method in ("json_schema", "function_calling"):
            structured = self.model().with_structured_output(Verdict, method=method, include_raw=True)
            result = structured.invoke("Judge this: the sky is green.")
            self.assertIsNone(result["parsing_error"], (method, result["raw"]))
            verdict = result["parsed"]
            self.assertIsInstance(verdict, Verdict, method)
            self.assertTrue(0 <= verdict.score <= 10)
            raw = result["raw"]
            text = raw.tool_calls[0]["args"] if method == "function_calling" else raw.content
            if method == "json_schema":
                self.assertLess(text.index('"reasoning"'), text.index('"score"'))  # the schema's member order
            else:
                self.assertEqual(raw.tool_calls[0]["name"], "Verdict")
                self.assertEqual(list(text), ["reasoning", "score"])

    def test_streamed_tool_call_chunks_merge(self):
        bound = self.model(streaming=True).bind_tools([lookup], tool_choice="required")
        merged = None
        num_chunks = 0
        for chunk in bound.stream("Weather in Rome?"):
            merged = chunk if merged is None else merged + chunk
            num_chunks += 1
        self.assertGreater(num_chunks, 2)  # the arguments arrive in pieces
        self.assertEqual(len(merged.tool_calls), 1, merged)
        call = merged.tool_calls[0]
        self.assertEqual(call["name"], "lookup")
        self.assertTrue(call["id"])
        self.assertIsInstance(call["args"]["city"], str)
        self.assertEqual(merged.invalid_tool_calls, [])


if __name__ == "__main__":
    unittest.main()
