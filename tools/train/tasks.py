"""Small, real, scorable tasks for training and scoring adapters on the default
model (issue 39): each item is a prompt, the answer a model should write after
it, and a scorer. Items are drawn from a seeded generator; the train and
held-out splits come from disjoint seed ranges, so no held-out item is trained on.

    from tasks import TASKS, make_split
    items = make_split("arithmetic", "heldout", 200)   # [{"prompt", "answer"}]
    TASKS["arithmetic"].score(prediction, item["answer"])  # 1.0 or 0.0

The prompt ends where the answer starts; INVOCATION ("\\n### Answer:") sits
between them, so an activated LoRA (aLoRA) adapter can be invoked there.
"""
import json
import random

INVOCATION = "\n### Answer:"

FIRST_NAMES = ["Maria", "James", "Aiko", "Omar", "Lena", "Carlos", "Priya", "Tom", "Sofia", "Wei", "Ana", "Ivan"]
LAST_NAMES = ["Lopez", "Smith", "Tanaka", "Haddad", "Berg", "Silva", "Rao", "Becker", "Rossi", "Chen", "Costa", "Novak"]
CITIES = ["Lyon", "Boston", "Osaka", "Cairo", "Oslo", "Lima", "Pune", "Graz", "Turin", "Xian", "Porto", "Brno"]
JOBS = ["nurse", "teacher", "pilot", "chef", "lawyer", "farmer", "baker", "welder", "editor", "tailor"]

TICKETS = {
    "billing": ["I was charged twice for my {thing}", "my invoice for the {thing} shows the wrong amount",
                "please refund the {thing} payment", "the price of the {thing} on my bill is wrong"],
    "technical": ["the {thing} app crashes when I open it", "I get an error message when the {thing} syncs",
                  "the {thing} page will not load", "the {thing} keeps disconnecting"],
    "account": ["I cannot log in to my {thing} account", "please change the email on my {thing} profile",
                "reset the password for my {thing} login", "delete my {thing} account"],
    "shipping": ["my {thing} has not arrived yet", "the {thing} was delivered to the wrong address",
                 "where is the parcel with my {thing}", "the {thing} box arrived damaged"],
}
THINGS = ["router", "phone", "laptop", "subscription", "headset", "camera", "printer", "watch"]

DAYS = ["today", "tomorrow", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
TOOLS = [
    {"name": "get_weather", "args": {"city": CITIES, "unit": ["celsius", "fahrenheit"], "day": DAYS},
     "ask": "What is the weather in {city} {day}? Use {unit}."},
    {"name": "book_table",
     "args": {"restaurant": ["Luigi's", "Sakura", "The Oak", "Blue Fin", "Casa Sol", "Nomad", "Pho 88", "Alma"],
              "people": list(range(1, 13)), "hour": list(range(12, 23))},
     "ask": "Book a table at {restaurant} for {people} people at {hour}:00."},
    {"name": "convert_currency", "args": {"amount": list(range(1, 1000)), "to": ["EUR", "USD", "JPY", "GBP"]},
     "ask": "Convert {amount} dollars to {to}."},
]
TOOL_CATALOGUE = ("Tools: get_weather(city, unit, day), book_table(restaurant, people, hour), "
                  "convert_currency(amount, to).")


def _arithmetic(rng):
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    op = rng.choice(["+", "-"])
    value = a + b if op == "+" else a - b
    return f"Compute {a} {op} {b}.", f" {a} {op} {b} = {value}"


def _extraction(rng):
    name = f"{rng.choice(FIRST_NAMES)} {rng.choice(LAST_NAMES)}"
    age, city, job = rng.randint(19, 79), rng.choice(CITIES), rng.choice(JOBS)
    prose = rng.choice(["{name}, {age}, lives in {city} and works as a {job}.",
                        "Meet {name}: a {job} from {city}, aged {age}.",
                        "At {age}, {name} is a {job} living in {city}."]).format(name=name, age=age, city=city, job=job)
    answer = json.dumps({"name": name, "age": age, "city": city, "job": job}, separators=(",", ":"))
    return f"Extract name, age, city and job as JSON: {prose}", " " + answer


def _sorting(rng):
    values = rng.sample(range(1, 100), rng.randint(4, 7))
    return (f"Sort ascending: {', '.join(map(str, values))}.", " " + ", ".join(map(str, sorted(values))))


def _labelling(rng):
    label = rng.choice(sorted(TICKETS))
    text = rng.choice(["", "Hi, ", "Hello team, ", "Urgent: "]) + rng.choice(TICKETS[label]).format(
        thing=rng.choice(THINGS)) + f" (order {rng.randint(1000, 9999)})"
    return f"Label the ticket as billing, technical, account or shipping: \"{text}\"", f" {label}"


def _tool_call(rng):
    tool = rng.choice(TOOLS)
    args = {key: rng.choice(values) for key, values in tool["args"].items()}
    call = json.dumps({"name": tool["name"], "arguments": args}, separators=(",", ":"))
    return f"{TOOL_CATALOGUE} {tool['ask'].format(**args)} Reply with the call as JSON.", " " + call


def _score_exact(prediction, answer):
    return 1.0 if prediction.strip().split("\n")[0].strip() == answer.strip() else 0.0


def _score_json(prediction, answer):
    line = prediction.strip().split("\n")[0].strip()
    try:
        return 1.0 if json.loads(line) == json.loads(answer) else 0.0
    except ValueError:
        return 0.0


class Task:
    def __init__(self, name, make, score):
        self.name, self.make, self.score = name, make, score


TASKS = {task.name: task for task in [
    Task("arithmetic", _arithmetic, _score_exact),
    Task("extraction", _extraction, _score_json),
    Task("sorting", _sorting, _score_exact),
    Task("labelling", _labelling, _score_exact),
    Task("tool_call", _tool_call, _score_json),
]}

# Disjoint seed ranges per split: an item is a function of (task, split, index) only.
_SPLIT_BASE = {"train": 0, "heldout": 10_000_000}


def make_item(task, split, index):
    rng = random.Random(f"{task}/{_SPLIT_BASE[split] + index}")
    question, answer = TASKS[task].make(rng)
    return {"task": task, "prompt": question + INVOCATION, "answer": answer}


TRAIN_SIZE = 4000  # the most train items a run uses; held-out items never repeat one of them


def make_split(task, split, count):
    """`count` distinct items of `task`; held-out ones never equal one of the first TRAIN_SIZE train items."""
    if split == "train":
        assert count <= TRAIN_SIZE
        return [make_item(task, split, i) for i in range(count)]
    seen = {make_item(task, "train", i)["prompt"] for i in range(TRAIN_SIZE)}
    items, index = [], 0
    while len(items) < count:
        item = make_item(task, split, index)
        index += 1
        if item["prompt"] not in seen:
            seen.add(item["prompt"])
            items.append(item)
    return items
