"""A DSL compatibility suite: programs written in SGLang's idioms (as its own examples and tests write
them), each a function run(backend) -> dict of what it produced. test_dsl_compat.py runs every program on
the Engine, on RuntimeEndpoint and, where meaningful, on sgl.OpenAI against the same server.

PROGRAMS maps a name to (run, on_openai, deterministic): on_openai False where the OpenAI API cannot carry
the construct (prompt logprobs, logprob returns); deterministic False where sampling or the approximate
OpenAI select may legitimately differ between backends.
"""

from __future__ import annotations

import radixrt as sgl

T0 = {"temperature": 0}
FEW_SHOT = (
    "Q: What is the capital of France?\nA: Paris\nQ: What is the capital of Japan?\nA: Tokyo\n"
)


@sgl.function
def few_shot_qa(s, question):
    s += FEW_SHOT + "Q: " + question + "\nA:" + sgl.gen("answer", max_tokens=8, stop="\n", **T0)


@sgl.function
def multi_turn(s, q1, q2):
    s += sgl.system("You are a terse assistant.")
    with s.user():
        s += q1
    with s.assistant():
        s += sgl.gen("a1", max_tokens=10, **T0)
    with s.user():
        s += q2
    with s.assistant():
        s += sgl.gen("a2", max_tokens=10, **T0)


@sgl.function
def select_yes_no(s):
    s += "Q: Is the sky blue on a clear day? Answer yes or no.\nA: " + sgl.select(
        "ans", choices=["yes", "no"]
    )


@sgl.function
def gen_with_choices(s):
    s += "My favourite colour is " + sgl.gen("colour", choices=["red", "green", "blue"])


@sgl.function
def gen_int_prog(s):
    s += "Q: What is 2 + 3?\nA: The answer is " + sgl.gen_int("n", max_tokens=4, **T0)


@sgl.function
def gen_string_prog(s):
    s += "The name of the French capital, as a JSON string: " + sgl.gen_string(
        "name", max_tokens=8, **T0
    )


@sgl.function
def gen_dtype_float(s):
    s += "Pi to two decimals is " + sgl.gen("pi", dtype=float, max_tokens=6, **T0)


@sgl.function
def regex_date(s):
    s += "The first moon landing happened on (YYYY-MM-DD): " + sgl.gen(
        "date", regex=r"19[0-9]{2}-[01][0-9]-[0-3][0-9]", max_tokens=12, **T0
    )


@sgl.function
def json_by_pieces(s):
    s += "A person as JSON:\n"
    s += '{"name": "' + sgl.gen("name", max_tokens=6, stop='"', **T0) + '", '
    s += '"age": ' + sgl.gen_int("age", max_tokens=3, **T0) + "}"


@sgl.function
def json_schema_prog(s):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    s += "The weather report as JSON: " + sgl.gen("report", json_schema=schema, max_tokens=24, **T0)


@sgl.function
def tool_use(s, question):
    s += "Question: " + question + "\nTool to use (search or calculator): "
    s += sgl.select("tool", choices=["search", "calculator"]) + "\n"
    if s["tool"] == "calculator":
        s += "Expression: " + sgl.gen("expr", max_tokens=8, stop="\n", **T0)
    else:
        s += "Query: " + sgl.gen("query", max_tokens=8, stop="\n", **T0)


@sgl.function
def react(s, question):
    s += "Answer by thinking and acting.\nQuestion: " + question + "\n"
    for i in range(2):
        s += f"Thought {i}: " + sgl.gen(f"thought_{i}", max_tokens=8, stop="\n", **T0) + "\n"
        s += f"Action {i}: " + sgl.select(f"action_{i}", choices=["Search", "Finish"]) + "\n"
        if s[f"action_{i}"] == "Finish":
            break
        s += f"Observation {i}: The capital of Italy is Rome.\n"


@sgl.function
def parallel_decoding(s, topic):
    s += "Two short ideas about " + topic + ".\n"
    forks = s.fork(2)
    for i in range(2):
        forks[i] += f"Idea {i + 1}:" + sgl.gen("idea", max_tokens=8, stop="\n", **T0)
    forks.join()
    s += "Idea 1:" + forks[0]["idea"] + "\nIdea 2:" + forks[1]["idea"] + "\nSummary:"
    s += sgl.gen("summary", max_tokens=8, stop="\n", **T0)


@sgl.function
def parallel_lambda(s):
    s += "Count with me.\n"
    forks = s.fork(3)
    forks += lambda i: f"Number {i}:" + sgl.gen("next", max_tokens=3, stop="\n", **T0)
    forks.join()


@sgl.function
def parallel_encoding(s):
    s += "Facts:\n"
    forks = s.fork(2)
    forks[0] += "The Nile is a river in Africa.\n"
    forks[1] += "Mount Fuji is a volcano in Japan.\n"
    forks.join("concate_and_append")
    s += "Question: Which fact mentions Japan?\nAnswer:" + sgl.gen(
        "answer", max_tokens=8, stop="\n", **T0
    )


@sgl.function(num_api_spec_tokens=32)
def spec_tokens(s):
    s += (
        "Name: "
        + sgl.gen("name", max_tokens=6, stop="\n", **T0)
        + "\nJob: "
        + sgl.gen("job", max_tokens=6, stop="\n", **T0)
    )


@sgl.function
def min_tokens_prog(s):
    s += "Say something:" + sgl.gen("x", min_tokens=6, max_tokens=8, **T0)


@sgl.function
def var_scope_prog(s):
    with s.var_scope("intro"):
        s += "Hello, my name is" + sgl.gen(max_tokens=5, stop="\n", **T0)
    s += "\nNice to meet you."


@sgl.function
def roles_and_messages(s):
    s += sgl.system("Answer in one word.")
    s += sgl.user("What colour is grass?")
    s += sgl.assistant(sgl.gen("colour", max_tokens=4, **T0))


@sgl.function
def explicit_role_markers(s):
    s += sgl.user_begin() + "Name a fruit." + sgl.user_end()
    s += sgl.assistant_begin() + sgl.gen("fruit", max_tokens=4, **T0) + sgl.assistant_end()


@sgl.function
def stop_list(s):
    s += "List three animals separated by commas:" + sgl.gen(
        "animals", max_tokens=16, stop=[".", "\n"], **T0
    )


@sgl.function
def unconditional_select(s):
    s += "The best pet is a " + sgl.select(
        "pet",
        choices=["cat", "dog", "goldfish"],
        choices_method=sgl.unconditional_likelihood_normalized,
    )


@sgl.function
def logprobs_prog(s):
    s += "The capital of France is" + sgl.gen(
        "x",
        max_tokens=3,
        return_logprob=True,
        top_logprobs_num=2,
        return_text_in_logprobs=True,
        **T0,
    )


@sgl.function
def penalties(s):
    s += "Repeat after me: la la la la" + sgl.gen(
        "x", max_tokens=8, frequency_penalty=0.8, presence_penalty=0.5, **T0
    )


@sgl.function
def sampled_n(s):
    s += "A random word:" + sgl.gen("words", n=2, max_tokens=4, temperature=0.8, seed=3)


def _run(fn, backend, **kwargs) -> dict:
    state = fn.run(backend=backend, **kwargs)
    return {"text": state.text(), "vars": {k: state[k] for k in state.stream_executor.variables}}


def run_streaming(backend) -> dict:
    state = few_shot_qa.run(question="What is the capital of Italy?", backend=backend, stream=True)
    pieces = list(state.text_iter("answer"))
    return {"text": state.text(), "vars": {"answer": state["answer"]}, "streamed": "".join(pieces)}


def run_batch_with_bar(backend) -> dict:
    states = few_shot_qa.run_batch(
        [
            {"question": "What is the capital of Spain?"},
            {"question": "What is the capital of Egypt?"},
        ],
        backend=backend,
        progress_bar=True,
    )
    return {"text": [s.text() for s in states], "vars": {"answers": [s["answer"] for s in states]}}


def run_messages(backend) -> dict:
    state = roles_and_messages.run(backend=backend)
    return {"text": state.text(), "vars": {"messages": state.messages()}}


def run_logprobs(backend) -> dict:
    state = logprobs_prog.run(backend=backend)
    meta = state.get_meta_info("x")
    entries = meta["output_token_logprobs"]
    # text in logprobs
    assert len(entries) == 3 and all(isinstance(e[2], str) for e in entries), entries
    return {"text": state.text(), "vars": {"tokens": [e[2] for e in entries]}}


PROGRAMS = {
    "few_shot_qa": (
        lambda b: _run(few_shot_qa, b, question="What is the capital of Italy?"),
        True,
        True,
    ),
    "multi_turn": (lambda b: _run(multi_turn, b, q1="Hi!", q2="Name a colour."), True, True),
    "select_yes_no": (lambda b: _run(select_yes_no, b), True, False),
    "gen_with_choices": (lambda b: _run(gen_with_choices, b), True, False),
    "gen_int": (lambda b: _run(gen_int_prog, b), True, True),
    "gen_string": (lambda b: _run(gen_string_prog, b), True, True),
    "gen_dtype_float": (lambda b: _run(gen_dtype_float, b), True, True),
    "regex_date": (lambda b: _run(regex_date, b), True, True),
    "json_by_pieces": (lambda b: _run(json_by_pieces, b), True, True),
    "json_schema": (lambda b: _run(json_schema_prog, b), True, True),
    "tool_use": (lambda b: _run(tool_use, b, question="What is 12 times 7?"), True, False),
    "react": (lambda b: _run(react, b, question="What is the capital of Italy?"), True, False),
    "parallel_decoding": (lambda b: _run(parallel_decoding, b, topic="gardens"), True, True),
    "parallel_lambda": (lambda b: _run(parallel_lambda, b), True, True),
    "parallel_encoding": (lambda b: _run(parallel_encoding, b), True, True),
    "spec_tokens": (lambda b: _run(spec_tokens, b), True, True),
    "min_tokens": (lambda b: _run(min_tokens_prog, b), True, True),
    "var_scope": (lambda b: _run(var_scope_prog, b), True, True),
    "messages": (run_messages, True, True),
    "explicit_role_markers": (lambda b: _run(explicit_role_markers, b), True, True),
    "stop_list": (lambda b: _run(stop_list, b), True, True),
    "unconditional_select": (lambda b: _run(unconditional_select, b), True, False),
    "logprobs": (run_logprobs, False, True),
    "penalties": (lambda b: _run(penalties, b), True, True),
    "sampled_n": (lambda b: _run(sampled_n, b), True, False),
    "streaming": (run_streaming, True, True),
    "run_batch_progress_bar": (run_batch_with_bar, True, True),
}
