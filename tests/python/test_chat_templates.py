"""Black-box tests of chat templates in `loom serve` with the real `openai`
client: --chat-template (a Mistral-style [INST] template), a per-request
`chat_template`, `chat_template_kwargs`, `continue_final_message`, tools and
tool turns in, and template errors as 400s that name the line.

What the template rendered is checked without a tokenize route: a greedy chat
completion must equal the greedy completion of the prompt text we expect
(same prompt token count, same output), and differ from another prompt's."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402

# The tiny model's tokenizer adds BOS to completions prompts; chat prompts get
# theirs from {{ bos_token }}, so both token lists start the same way. Its
# eos_token is <|eot_id|> (a Llama-3 vocabulary).
MISTRAL_TEMPLATE = """{{- bos_token }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {{- '[INST] ' + message['content'] + '[/INST]' }}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] | trim + eos_token }}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported!') }}
    {%- endif %}
{%- endfor %}
"""
GREEDY = {"temperature": 0.0, "max_tokens": 8, "logprobs": True, "extra_body": {"ignore_eos": True}}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


class ChatTemplateTest(loom_server.ServerTestCase):
    template_file = None

    @classmethod
    def setUpClass(cls):
        handle, cls.template_file = tempfile.mkstemp(suffix=".jinja")
        with os.fdopen(handle, "w") as file:
            file.write(MISTRAL_TEMPLATE)
        cls.SERVER_ARGS = ["--chat-template", cls.template_file, "--max-context-tokens", "2048"]
        cls.SERVER_KWARGS = {"num_adapters": 1}
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        os.unlink(cls.template_file)

    def chat(self, messages, extra_body=None, **kwargs):
        args = {**GREEDY, **kwargs}
        args["extra_body"] = {**GREEDY["extra_body"], **(extra_body or {})}
        return self.client.chat.completions.create(model="tiny", messages=messages, **args)

    def complete(self, prompt):
        return self.client.completions.create(model="tiny", prompt=prompt, temperature=0.0, max_tokens=8, logprobs=0,
                                              extra_body={"ignore_eos": True})

    def assert_prompt(self, chat_response, prompt_text):
        """The chat request's prompt was `prompt_text` (after the BOS)."""
        completion = self.complete(prompt_text)
        self.assertEqual(chat_response.usage.prompt_tokens, completion.usage.prompt_tokens)
        self.assertEqual(chat_response.choices[0].message.content, completion.choices[0].text)
        chat_logprobs = [entry.logprob for entry in chat_response.choices[0].logprobs.content]
        for got, expected in zip(chat_logprobs, completion.choices[0].logprobs.token_logprobs):
            self.assertAlmostEqual(got, expected, places=4)

    def bad_request(self, **kwargs):
        with self.assertRaises(openai.BadRequestError) as raised:
            self.chat(**kwargs)
        return raised.exception.body

    def test_server_template_renders_inst_prompts(self):
        messages = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": " Hi! "},
                    {"role": "user", "content": "How are you?"}]
        response = self.chat(messages)
        self.assert_prompt(response, "[INST] Hello there[/INST] Hi!<|eot_id|>[INST] How are you?[/INST]")
        chatml = self.complete("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n")
        self.assertNotEqual(response.usage.prompt_tokens, chatml.usage.prompt_tokens)

    def test_per_request_template_overrides(self):
        messages = [{"role": "user", "content": "Hello there"}]
        response = self.chat(messages, extra_body={"chat_template": "{{ bos_token }}Q: {{ messages[0].content }}\nA:"})
        self.assert_prompt(response, "Q: Hello there\nA:")

    def test_chat_template_kwargs_reach_the_template(self):
        template = ("{{ bos_token }}{{ messages[-1].content }}"
                    "{% if enable_thinking is defined and not enable_thinking %} /no_think{% endif %}")
        messages = [{"role": "user", "content": "Think about cats"}]
        thinking = self.chat(messages, extra_body={"chat_template": template})
        self.assert_prompt(thinking, "Think about cats")
        not_thinking = self.chat(messages, extra_body={"chat_template": template,
                                                       "chat_template_kwargs": {"enable_thinking": False}})
        self.assert_prompt(not_thinking, "Think about cats /no_think")
        self.assertGreater(not_thinking.usage.prompt_tokens, thinking.usage.prompt_tokens)

    def test_continue_final_message_leaves_the_answer_open(self):
        messages = [{"role": "user", "content": "Count to five"}, {"role": "assistant", "content": "One, two,"}]
        response = self.chat(messages, extra_body={"add_generation_prompt": False, "continue_final_message": True})
        self.assert_prompt(response, "[INST] Count to five[/INST] One, two,")
        body = self.bad_request(messages=messages, extra_body={"continue_final_message": True})
        self.assertIn("add_generation_prompt", body["message"])
        body = self.bad_request(messages=messages[:1], extra_body={"add_generation_prompt": False,
                                                                   "continue_final_message": True})
        self.assertIn("final assistant message", body["message"])

    def test_tool_turns_and_tools_reach_the_template(self):
        template = ("{{ bos_token }}{% for t in tools %}TOOL {{ t.function.name }} {{ t.function.parameters | tojson }}\n"
                    "{% endfor %}{% for m in messages %}{{ m.role }}:"
                    "{% for c in m.tool_calls | default([]) %} call {{ c.id }} {{ c.function.name }}"
                    " {{ c.function.arguments | tojson }}{% endfor %}"
                    "{% if m.tool_call_id %} result {{ m.tool_call_id }}{% endif %} {{ m.content }}\n{% endfor %}")
        messages = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
        ]
        # tool_choice "none": this server has no tool-call parser, so "auto" would be a 400 (test_tool_calls).
        response = self.chat(messages, tools=TOOLS, tool_choice="none", extra_body={"chat_template": template})
        self.assert_prompt(response, 'TOOL get_weather {"type": "object", "properties": {"city": {"type": "string"}}, '
                                     '"required": ["city"]}\nuser: Weather in Paris?\nassistant: call call_1 '
                                     'get_weather {"city": "Paris"} \ntool: result call_1 21 C\n')
        body = self.bad_request(messages=messages, tools=[{"type": "function", "function": {"description": "x"}}])
        self.assertEqual(body["param"], "tools[0].function.name")
        bad_arguments = json.loads(json.dumps(messages))
        bad_arguments[1]["tool_calls"][0]["function"]["arguments"] = "{oops"
        body = self.bad_request(messages=bad_arguments, extra_body={"chat_template": template})
        self.assertEqual(body["param"], "messages[1].tool_calls[0].function.arguments")

    def test_template_errors_are_400s_naming_the_line(self):
        messages = [{"role": "user", "content": "hi"}]
        body = self.bad_request(messages=messages, extra_body={"chat_template": "ok\n{% for x in %}"})
        self.assertIn("template line 2", body["message"])
        self.assertEqual(body["param"], "chat_template")
        body = self.bad_request(messages=[{"role": "system", "content": "s"}, *messages])
        self.assertIn("Only user and assistant roles are supported!", body["message"])
        self.assertIn("template line 8", body["message"])
        body = self.bad_request(messages=messages, extra_body={"chat_template": "\n\n{{ messages[0].content.nope() }}"})
        self.assertIn("template line 3", body["message"])
        body = self.bad_request(messages=messages, extra_body={"chat_template_kwargs": {"messages": []}})
        self.assertIn("chat_template_kwargs", body["message"])
        self.assertEqual(self.chat(messages, max_tokens=2).usage.completion_tokens, 2)  # still serving


class BadChatTemplateFlagTest(unittest.TestCase):
    def test_syntax_error_stops_the_server_naming_the_line(self):
        with tempfile.TemporaryDirectory() as directory:
            model = os.path.join(directory, "model")
            subprocess.run([loom_server.loom_binary(), "make-model", "--arch", "llama", "--preset", "tiny", "--out",
                            model], check=True, stdout=subprocess.DEVNULL)
            result = subprocess.run([loom_server.loom_binary(), "serve", "--model", model, "--port", "0",
                                     "--chat-template", "{{ ok }}\n{% if %}"],
                                    capture_output=True, text=True, timeout=120)
            self.assertNotEqual(result.returncode, 0)
            self.assertIn("template line 2", result.stdout + result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
