"""The quality tasks of tools/train/tasks.py (issue 39): items are a function of
(task, split, index) alone, held-out items never repeat a train item, every task
has at least 200 distinct held-out items, the prompt ends with the aLoRA
invocation, and each scorer accepts the answer and refuses a wrong one."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "train"))
from tasks import INVOCATION, TASKS, TRAIN_SIZE, make_item, make_split  # noqa: E402


class TrainTasksTest(unittest.TestCase):
    def test_items_are_deterministic(self):
        for task in TASKS:
            self.assertEqual(make_split(task, "train", 50), make_split(task, "train", 50))
            self.assertEqual(make_item(task, "heldout", 7), make_item(task, "heldout", 7))
            self.assertNotEqual(make_item(task, "train", 0), make_item(task, "train", 1))

    def test_heldout_is_distinct_and_disjoint_from_train(self):
        for task in TASKS:
            train = {item["prompt"] for item in make_split(task, "train", TRAIN_SIZE)}
            heldout = make_split(task, "heldout", 200)
            prompts = [item["prompt"] for item in heldout]
            self.assertEqual(len(set(prompts)), 200, task)
            self.assertFalse(train & set(prompts), task)

    def test_prompts_end_with_the_invocation_and_answers_score(self):
        for task, spec in TASKS.items():
            for item in make_split(task, "heldout", 20):
                self.assertTrue(item["prompt"].endswith(INVOCATION))
                self.assertEqual(spec.score(item["answer"] + "\nmore text", item["answer"]), 1.0)
                self.assertEqual(spec.score(" wrong", item["answer"]), 0.0)

    def test_json_answers_parse_and_scoring_ignores_spacing(self):
        item = make_item("extraction", "heldout", 3)
        spaced = json.dumps(json.loads(item["answer"]))  # ", " and ": " separators
        self.assertEqual(TASKS["extraction"].score(" " + spaced, item["answer"]), 1.0)
        item = make_item("tool_call", "heldout", 3)
        self.assertIn(json.loads(item["answer"])["name"], {"get_weather", "book_table", "convert_currency"})


if __name__ == "__main__":
    unittest.main()
