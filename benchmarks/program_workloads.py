"""The DSL programs bench_programs.py runs: few-shot multiple choice (select), multi-turn
chat, tree of thought (nested fork/join), JSON decode (json_schema), ReAct agent loop, and
long-document QA (one ~1,500-token synthetic report, many questions about it, one program each)."""

from __future__ import annotations

import radixrt as sgl

MC_SHOTS = [
    ("Which planet is known as the Red Planet?", ["Venus", "Mars", "Jupiter", "Saturn"], "B"),
    ("What is the boiling point of water at sea level?", ["50 C", "80 C", "100 C", "120 C"], "C"),
    ("Which animal is the largest mammal?", ["Blue whale", "Elephant", "Giraffe", "Hippo"], "A"),
    ("How many continents are there?", ["Five", "Six", "Eight", "Seven"], "D"),
    ("What do bees make?", ["Milk", "Honey", "Silk", "Wool"], "B"),
]
MC_QUESTIONS = [
    ("What is the capital of Italy?", ["Rome", "Paris", "Madrid", "Berlin"]),
    ("How many legs does a spider have?", ["Six", "Ten", "Eight", "Four"]),
    ("What gas do plants absorb?", ["Oxygen", "Carbon dioxide", "Helium", "Neon"]),
    ("Which metal is liquid at room temperature?", ["Iron", "Gold", "Copper", "Mercury"]),
    ("What is the square root of 81?", ["7", "8", "9", "10"]),
    ("Who painted the Mona Lisa?", ["Da Vinci", "Picasso", "Monet", "Van Gogh"]),
    ("What is the currency of Japan?", ["Won", "Yuan", "Yen", "Ringgit"]),
    ("Which organ pumps blood?", ["Lung", "Heart", "Liver", "Kidney"]),
]
LETTERS = ["A", "B", "C", "D"]


def _mc_block(question: str, options: list[str]) -> str:
    return (
        f"Question: {question}\n"
        + "".join(f"{l}. {o}\n" for l, o in zip(LETTERS, options))
        + "Answer: "
    )


@sgl.function
def multiple_choice(s, question, options):
    s += "The following are multiple choice questions about general knowledge.\n\n"
    for q, opts, answer in MC_SHOTS:
        s += _mc_block(q, opts) + answer + "\n\n"
    s += _mc_block(question, options)
    s += sgl.select("answer", choices=LETTERS)


CHAT_TURNS = [
    ["What is a good name for a cat?", "Why that name?", "Give one more."],
    ["How do I boil an egg?", "How long for a soft egg?", "And a hard one?"],
    ["Suggest a weekend hobby.", "How do I start?", "What does it cost?"],
    ["What is the sun made of?", "How hot is it?", "Will it burn out?"],
]


@sgl.function
def multi_turn_chat(s, turns, max_tokens=24):
    s += sgl.system("You are a helpful assistant. Answer in one or two sentences.")
    for i, question in enumerate(turns):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen(f"answer_{i}", max_tokens=max_tokens))


TOT_QUESTIONS = [
    "A shop sells pens at 3 dollars each. How much do 7 pens cost?",
    "A train travels 60 km per hour for 3 hours. How far does it go?",
]


@sgl.function
def tree_of_thought(s, question):
    s += sgl.user(question)
    s += sgl.assistant_begin()
    plans = s.fork(2)
    plans += lambda i: f"Approach {i + 1}:" + sgl.gen("plan", max_tokens=16, stop="\n") + "\n"
    groups = [plan.fork(2) for plan in plans]
    for steps in groups:
        steps += lambda j: (
            f"Step {j + 1}:"
            + sgl.gen("step", max_tokens=16, stop="\n")
            + "\nIs this correct? "
            + sgl.select("ok", choices=["yes", "no"])
        )
    for steps in groups:
        steps.join()
    plans.join()
    s += sgl.assistant_end()


PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
JSON_TEXTS = [
    "Maria Lopez, 34, lives in Lisbon.",
    "Kenji Sato is 71 and runs a bakery in Osaka.",
    "Anna Berg (29) moved to Oslo.",
    "Tom Reed, aged 45, works in Dublin.",
    "Lena Vogel, 52, teaches in Vienna.",
    "Omar Haddad is 38 and lives in Cairo.",
]


@sgl.function
def json_decode(s, text):
    s += sgl.user("Extract the person's name, age and city as JSON.\nText: " + text)
    s += sgl.assistant(sgl.gen("json", max_tokens=48, json_schema=PERSON_SCHEMA))


AGENT_TASKS = [
    "How tall is the Eiffel Tower in centimetres?",
    "What is 17 times 23?",
    "How many people live in Paris?",
]
AGENT_FACTS = {
    "eiffel": "The Eiffel Tower is 330 metres tall.",
    "paris": "About 2.1 million people live in Paris.",
}


@sgl.function
def agent_loop(s, task, num_steps=3):
    s += (
        "Solve the task with tools. lookup[topic] returns a fact; calculate[expr] does arithmetic; "
        "finish[answer] ends.\n\nTask: " + task + "\n"
    )
    for step in range(num_steps):
        s += f"Thought {step + 1}:" + sgl.gen(f"thought_{step}", max_tokens=16, stop="\n") + "\n"
        s += f"Action {step + 1}: " + sgl.select(
            f"tool_{step}", choices=["lookup", "calculate", "finish"]
        )
        s += "[" + sgl.gen(f"arg_{step}", max_tokens=8, stop="]") + "]\n"
        if s[f"tool_{step}"] == "finish":
            break
        arg = s[f"arg_{step}"].lower()
        fact = next((f for k, f in AGENT_FACTS.items() if k in arg), "No result.")
        s += f"Observation {step + 1}: {fact}\n"


REGIONS = ["North", "South", "East", "West", "Central", "Coastal", "Mountain", "Valley"]
PRODUCTS = ["pumps", "valves", "sensors", "filters", "motors", "cables", "meters", "gears"]
MANAGERS = ["Ada Moss", "Ben Ortiz", "Cleo Park", "Dev Rao", "Eva Lind", "Finn Hale"]


def _section(i: int) -> str:
    region, product = REGIONS[i % len(REGIONS)], PRODUCTS[(i * 3 + i // 8) % len(PRODUCTS)]
    units, staff = 120 + (i * 37) % 880, 8 + (i * 11) % 60
    return (
        f"Section {i + 1}. In quarter {i % 4 + 1} the {region} office, led by "
        f"{MANAGERS[i % len(MANAGERS)]}, sold {units} {product} with a staff of {staff}. "
        f"Returns were {(i * 7) % 19 + 1} percent and the backlog stood at {(i * 53) % 400} "
        f"orders; the office rated customer service {(i * 5) % 10 + 1} out of 10.\n"
    )


# deterministic synthetic text: ~1,500 tokens of the default model's tokenizer
LONG_DOCUMENT = (
    "Annual operations report of the Harbor Instruments Company.\n\n"
    + "".join(_section(i) for i in range(24))
    + "End of report.\n"
)
LONG_DOC_QUESTIONS = [
    f"How many {PRODUCTS[(i * 3 + i // 8) % len(PRODUCTS)]} did the {REGIONS[i % len(REGIONS)]} "
    f"office sell in quarter {i % 4 + 1}?"
    for i in range(0, 24, 3)
] + [f"Who led the office described in section {i + 1}?" for i in range(1, 24, 3)]


@sgl.function
def long_document_qa(s, question):
    s += sgl.system("Answer questions about the report in a few words.")
    s += sgl.user("Report:\n" + LONG_DOCUMENT + "\nQuestion: " + question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=16, stop="\n"))


def workloads(scale: int) -> dict[str, tuple]:
    def times(items: list) -> list:
        return [x for _ in range(scale) for x in items]

    return {
        "mc": (multiple_choice, times([{"question": q, "options": o} for q, o in MC_QUESTIONS])),
        "chat": (multi_turn_chat, times([{"turns": t} for t in CHAT_TURNS])),
        "tot": (tree_of_thought, times([{"question": q} for q in TOT_QUESTIONS])),
        "json": (json_decode, times([{"text": t} for t in JSON_TEXTS])),
        "agent": (agent_loop, times([{"task": t} for t in AGENT_TASKS])),
        "longdoc": (long_document_qa, times([{"question": q} for q in LONG_DOC_QUESTIONS])),
    }
