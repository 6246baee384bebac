"""The peer of loom_bench_chat_template: the same template, tools and conversation rendered by Python's
jinja2 (the sandboxed environment transformers and vLLM use). Prints messages, rendered characters and
the median of 10 renders.   .venv/bin/python bench/chat_template_jinja2.py"""
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from make_jinja_fixtures import environment
src = open(os.path.join(ROOT, "tests", "fixtures", "chat", "qwen3.jinja")).read()
env = environment()
t = env.from_string(src)
sentence = "The function parses the request, checks every field and hands the batch over. "
par = lambda n: sentence * n
tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": f"Tool number {i}: searches, reads or edits the codebase.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "File or directory the tool works on"},
           "limit": {"type": "integer", "description": "How many results at most"}, "mode": {"enum": ["fast", "thorough", "dry-run"]}}, "required": ["path"]}}} for i in range(20)]
for chars in (8 << 10, 96 << 10):
    msgs = [{"role": "system", "content": "You are a coding agent. " + par(4)}]
    total = 0; turn = 0
    while total < chars:
        user = f"Step {turn}: " + par(2)
        msgs.append({"role": "user", "content": user})
        cid = f"call_{turn}"
        msgs.append({"role": "assistant", "content": par(1), "tool_calls": [{"id": cid, "type": "function", "function": {"name": f"tool_{turn % 20}", "arguments": {"path": f"src/module_{turn}.cc", "limit": 5}}}]})
        res = par(4)
        msgs.append({"role": "tool", "tool_call_id": cid, "content": res})
        total += len(user) + len(sentence) + len(res) + 60; turn += 1
    msgs.append({"role": "user", "content": "Summarise what you found."})
    times = []
    for _ in range(10):
        s = time.perf_counter(); out = t.render(messages=msgs, tools=tools, add_generation_prompt=True, eos_token="<|im_end|>"); times.append(time.perf_counter() - s)
    times.sort()
    print(chars, len(msgs), len(out), "median ms", round(times[5] * 1000, 2))
