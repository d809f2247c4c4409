"""Prompt sets shared by the benchmarks: a few-shot prefix with distinct short questions."""

from __future__ import annotations

FEW_SHOT = [
    ("What is the capital of France?", "Paris is the capital of France."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What gas do plants absorb from the air?", "Plants absorb carbon dioxide from the air."),
    ("Who wrote the play Romeo and Juliet?", "William Shakespeare wrote Romeo and Juliet."),
    (
        "What is the boiling point of water at sea level?",
        "Water boils at 100 degrees Celsius at sea level.",
    ),
    ("Which planet is known as the Red Planet?", "Mars is known as the Red Planet."),
    ("What is the largest ocean on Earth?", "The Pacific Ocean is the largest ocean on Earth."),
    ("How many days are in a leap year?", "A leap year has 366 days."),
    ("What is the chemical symbol for gold?", "The chemical symbol for gold is Au."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa."),
    ("What is the square root of 81?", "The square root of 81 is 9."),
    ("Which animal is the largest mammal?", "The blue whale is the largest mammal."),
    ("What language is spoken in Brazil?", "Portuguese is the main language spoken in Brazil."),
    ("How many continents are there?", "There are seven continents."),
    (
        "What is the freezing point of water in Fahrenheit?",
        "Water freezes at 32 degrees Fahrenheit.",
    ),
    ("Which organ pumps blood through the body?", "The heart pumps blood through the body."),
    (
        "What is the tallest mountain in the world?",
        "Mount Everest is the tallest mountain in the world.",
    ),
    (
        "Who developed the theory of relativity?",
        "Albert Einstein developed the theory of relativity.",
    ),
    ("What is the main ingredient in guacamole?", "Avocado is the main ingredient in guacamole."),
    ("How many minutes are in an hour?", "There are sixty minutes in an hour."),
    ("What is the hardest natural substance?", "Diamond is the hardest natural substance."),
    ("Which country is home to the kangaroo?", "Australia is home to the kangaroo."),
    ("What is the longest river in Africa?", "The Nile is the longest river in Africa."),
    ("How many sides does a hexagon have?", "A hexagon has six sides."),
    ("What do bees make?", "Bees make honey and beeswax."),
    (
        "Which metal is liquid at room temperature?",
        "Mercury is a metal that is liquid at room temperature.",
    ),
    ("What is the closest star to Earth?", "The Sun is the closest star to Earth."),
    (
        "Who was the first person to walk on the Moon?",
        "Neil Armstrong was the first person to walk on the Moon.",
    ),
    ("What is the currency of Japan?", "The currency of Japan is the yen."),
    ("How many strings does a standard guitar have?", "A standard guitar has six strings."),
    ("What is the smallest prime number?", "The smallest prime number is 2."),
    ("Which vitamin do we get from sunlight?", "Our skin makes vitamin D in sunlight."),
]

QUESTIONS = [
    "What is the capital of Italy?",
    "How many wheels does a bicycle have?",
    "What color is the sky on a clear day?",
    "Who invented the telephone?",
    "What is the largest planet in our solar system?",
    "How many hours are in a day?",
    "What is the capital of Germany?",
    "Which animal is known as the king of the jungle?",
    "What is frozen water called?",
    "How many months are in a year?",
    "What is the opposite of hot?",
    "Which bird is a symbol of peace?",
    "What is the capital of Spain?",
    "How many players are on a soccer team?",
    "What do cows drink?",
    "What is the main language of Mexico?",
    "Which season comes after winter?",
    "What is 12 times 12?",
    "What is the capital of Canada?",
    "Which fruit is yellow and curved?",
    "How many teeth does an adult have?",
    "What is the fastest land animal?",
    "Which instrument has 88 keys?",
    "What is the capital of Egypt?",
    "How many colors are in a rainbow?",
    "What do caterpillars turn into?",
    "What is the capital of Kenya?",
    "Which planet has rings?",
    "What is the largest desert?",
    "How many bones are in the human body?",
    "What is the capital of Peru?",
    "Which gas do humans breathe out?",
]


def few_shot_prefix(num_shots: int = len(FEW_SHOT)) -> str:
    lines = ["Answer each question with one short, correct sentence.", ""]
    for q, a in FEW_SHOT[:num_shots]:
        lines += [f"Question: {q}", f"Answer: {a}", ""]
    return "\n".join(lines)


def shared_prefix_prompts(num_questions: int, num_shots: int = len(FEW_SHOT)) -> list[str]:
    prefix = few_shot_prefix(num_shots)
    qs = [
        QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" (#{i})")
        for i in range(num_questions)
    ]
    return [f"{prefix}Question: {q}\nAnswer:" for q in qs]
