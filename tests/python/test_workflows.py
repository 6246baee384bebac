"""Black-box tests of the workflow API on `loom serve --eviction-policy
workflow`: declare a step graph, post progress, send completions with the
openai client's extra_body workflow/agent hints (and SGLang's agent_hints,
vLLM's kv_hints), DELETE, bad bodies -> 400."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loom_server  # noqa: E402

loom_server.require_openai()
import openai  # noqa: E402

CYCLE = {"agents": [{"name": "planner", "after": ["reviewer"]},
                    {"name": "executor", "after": ["planner"]},
                    {"name": "expresser", "after": ["executor"]},
                    {"name": "reviewer", "after": ["expresser"]}]}


class WorkflowApiTest(loom_server.ServerTestCase):
    SERVER_ARGS = ["--eviction-policy", "workflow", "--workflow-ttl-seconds", "300"]
    SERVER_KWARGS = {"num_adapters": 1}

    def call(self, method, path, body=None, raw=None):
        status, _, data = self.server.request(method, path, body, raw=raw)
        return status, loom_server.json.loads(data) if data else None

    def test_declare_progress_requests_delete(self):
        status, body = self.call("PUT", "/v1/workflows/py-w1", CYCLE)
        self.assertEqual(status, 200, body)
        self.assertTrue(body["has_graph"])
        self.assertEqual(set(body["steps_to_execution"]), {"planner", "executor", "expresser", "reviewer"})

        status, body = self.call("POST", "/v1/workflows/py-w1/progress", {"running": ["executor"]})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["steps_to_execution"], {"executor": 0, "expresser": 1, "reviewer": 2, "planner": 3})

        system = "You are the expresser. Turn the executor's notes into a short friendly answer. " * 3
        for task in ("first task", "second task"):
            completion = self.client.completions.create(
                model="tiny", prompt=system + task, max_tokens=4, temperature=0.0,
                extra_body={"workflow": "py-w1", "agent": "expresser", "ignore_eos": True})
            self.assertEqual(len(completion.choices), 1)
        chat = self.client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "review this"}], max_tokens=3,
            extra_body={"workflow": "py-w1", "agent": "reviewer", "fixed_prefix_tokens": 4, "ignore_eos": True})
        self.assertEqual(chat.choices[0].message.role, "assistant")
        # Progress was posted, so requests do not move `running`.
        status, body = self.call("GET", "/v1/workflows/py-w1")
        self.assertEqual(status, 200, body)
        self.assertEqual(body["running"], ["executor"])

        metrics = self.server.metrics()
        self.assertGreaterEqual(metrics["loom_workflows_active"], 1)
        self.assertEqual(metrics['loom_kv_eviction_policy_info{policy="workflow"}'], 1)
        self.assertIn("loom_evicted_tokens_total", metrics)

        status, body = self.call("DELETE", "/v1/workflows/py-w1")
        self.assertEqual((status, body["deleted"]), (200, True))
        status, body = self.call("DELETE", "/v1/workflows/py-w1")
        self.assertEqual(status, 404, body)
        self.assertEqual(body["error"]["code"], "not_found")

    def test_requests_alone_drive_the_workflow(self):
        for agent in ("scout", "writer"):
            self.client.completions.create(model="tiny", prompt="hello there", max_tokens=2,
                                           extra_body={"workflow": "py-free", "agent": agent})
        status, body = self.call("GET", "/v1/workflows/py-free")
        self.assertEqual(status, 200, body)
        self.assertFalse(body["has_graph"])
        self.assertEqual(body["running"], ["writer"])
        self.assertEqual(body["steps_to_execution"], {"writer": 0})

    def test_sglang_agent_hints_and_vllm_kv_hints_reach_the_workflow(self):
        """Requests that name their agent only under SGLang's or vLLM's field drive the workflow as Loom's do;
        the Responses API passes them on too."""
        self.client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "plan"}], max_tokens=2,
            extra_body={"agent_hints": {"workflow_id": "py-alias", "agent_id": "planner", "step_id": "1",
                                        "reuse_hint": "high"}})
        status, body = self.call("GET", "/v1/workflows/py-alias")
        self.assertEqual(status, 200, body)
        self.assertEqual(body["running"], ["planner"])
        envelope = {"protocol_version": "0.1", "message_id": "py-1", "actions": [
            {"action_id": "keep", "action_type": "vllm.set_priority", "action_version": "1.0",
             "payload": {"target": "request_cached", "value": 10}},
            {"action_id": "who", "action_type": "loom.workflow", "action_version": "1.0",
             "payload": {"workflow": "py-alias", "agent": "coder", "fixed_prefix_tokens": 2}}]}
        self.client.completions.create(model="tiny", prompt="write code", max_tokens=2,
                                       extra_body={"kv_hints": envelope})
        status, body = self.call("GET", "/v1/workflows/py-alias")
        self.assertEqual(body["running"], ["coder"])
        self.client.responses.create(model="tiny", input="review", max_output_tokens=2,
                                     extra_body={"agent_hints": {"workflow_id": "py-alias", "agent_id": "critic"}})
        status, body = self.call("GET", "/v1/workflows/py-alias")
        self.assertEqual(body["running"], ["critic"])

        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.completions.create(model="tiny", prompt="hi", max_tokens=1, extra_body={
                "workflow": "py-alias", "agent_hints": {"workflow_id": "another"}})
        self.assertEqual(caught.exception.body["param"], "agent_hints.workflow_id")
        envelope["actions"][1]["payload"]["agent"] = ""
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.completions.create(model="tiny", prompt="hi", max_tokens=1, extra_body={"kv_hints": envelope})
        self.assertEqual(caught.exception.body["param"], "kv_hints.actions[1].payload.agent")
        status, body = self.call("GET", "/v1/workflows/py-alias")
        self.assertEqual(body["running"], ["critic"], "a refused request moved the workflow")

    def test_bad_bodies_are_400(self):
        status, body = self.call("PUT", "/v1/workflows/py-bad", {"agents": [{"name": "a", "after": ["b", "b"]}]})
        self.assertEqual(status, 400, body)
        self.assertEqual(body["error"]["type"], "invalid_request_error")
        self.assertEqual(body["error"]["param"], "agents[0].after[1]")
        status, body = self.call("PUT", "/v1/workflows/py-bad", raw=b"{nope")
        self.assertEqual(status, 400, body)
        status, body = self.call("POST", "/v1/workflows/never-seen/progress", {"running": ["a"]})
        self.assertEqual(status, 404, body)
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.completions.create(model="tiny", prompt="hi", max_tokens=1,
                                           extra_body={"agent": "planner"})
        self.assertEqual(caught.exception.body["param"], "agent")
        with self.assertRaises(openai.BadRequestError):
            self.client.completions.create(model="tiny", prompt="hi", max_tokens=1,
                                           extra_body={"workflow": "w", "agent": "a", "fixed_prefix_tokens": -2})


if __name__ == "__main__":
    unittest.main()
