"""SGLang's own frontend, unchanged, against a real `radixrt serve`, and the SGLang parameters and routes it
uses over raw HTTP. The client: `import sglang as sgl`, a RuntimeEndpoint on
the server's URL, and the programs of `sglang.test.test_programs` (sglang 0.5.23 from the registry, installed by
tests/install_sglang_client.sh, which the README's test command runs).

Every program that needs no image and no OpenAI backend runs. Most must pass as SGLang's own CI runs them; a few
assert what a 135M model happens to know (capital cities, the hours in a day, where Linus Torvalds lives): for
those the program must run to its end and produce its variables, checked on the states the program returned.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import pathlib
import re
import sys
import traceback
import types

import httpx
import pytest
from conftest_server import ServerProcess, sse_events

CHECKED_VERSION = "0.5.23"  # a newer client may send fields this server does not know yet

NEEDS_IMAGES = {"test_image_qa"}
# API speculative execution (num_api_spec_tokens) is the OpenAI backend's: the first reads its token_usage, the
# second fails inside the client on RuntimeEndpoint (no is_chat_model attribute) whatever the server does
NEEDS_OPENAI_BACKEND = {"test_completion_speculative", "test_chat_completion_speculative"}


def _variables_produced(names):
    def check(states):
        assert states, "the program returned no state"
        for state in states:
            for name in names:
                assert str(state[name]).strip(), f"{name} is empty"

    return check


def _ints_produced(names):
    def check(states):
        for state in states:
            for name in names:
                int(state[name])  # regex-constrained to an integer: it must parse

    return check


def _json_output_matches_the_programs_regexes(states):
    """test_decode_json samples (temperature 1) under SGLang's own REGEX_INT, which admits a leading
    zero ("area": 066332 was sampled once), so its json.loads may fail whatever the server does:
    what the server guarantees is the program's template with each field in the regex it sent."""

    from sglang.lang.ir import REGEX_INT, REGEX_STR

    fields = [("name", REGEX_STR), ("population", REGEX_INT), ("area", REGEX_INT),
              ("country", REGEX_STR), ("timezone", REGEX_STR)]  # fmt: skip
    template = (
        re.escape("{\n")
        + re.escape(",\n").join(re.escape(f'  "{k}": ') + f"(?:{rx})" for k, rx in fields)
        + re.escape("\n}")
    )
    assert states, "the program returned no state"
    for state in states:
        assert re.fullmatch(template, state["json_output"]), state["json_output"]


# program -> how its states are checked when only its model-dependent assertion fails
KNOWLEDGE_BOUND = {
    "test_few_shot_qa": _variables_produced(["answer"]),
    "test_decode_int": _ints_produced(["hours", "days"]),
    "test_react": _variables_produced(["action_1"]),
    "test_decode_json": _json_output_matches_the_programs_regexes,
}
# program -> its knowledge assertions, as their source reads in sglang/test/test_programs.py (a part
# of the asserting line each): only these may fail, and only in the program's own body
KNOWLEDGE_ASSERTIONS = {
    "test_few_shot_qa": ('"washington" in ret["answer"]',),
    "test_decode_int": ('int(ret["hours"]) == 24', 'int(ret["days"]) == 365'),
    "test_react": ('"finland" in answer or "states" in answer',),
    "test_decode_json": ('json.loads(ret["json_output"])',),
}


def failed_on_knowledge(name: str, error: AssertionError, programs_file: str) -> bool:
    """Whether error is one of program name's own knowledge assertions: raised in its body, in
    programs_file, on a line holding one of KNOWLEDGE_ASSERTIONS[name] (any other assertion, in
    the program or below it, is a failure)."""
    frames = traceback.extract_tb(error.__traceback__)
    if isinstance(error, json.JSONDecodeError):  # raised inside json: the program's line calls it
        frames = [f for f in frames if pathlib.Path(f.filename) == pathlib.Path(programs_file)]
    if not frames:
        return False
    where = frames[-1]  # where the assertion was raised
    return (
        pathlib.Path(where.filename).resolve() == pathlib.Path(programs_file).resolve()
        and where.name == name
        and any(source in (where.line or "") for source in KNOWLEDGE_ASSERTIONS.get(name, ()))
    )


def program_names() -> list[str]:
    """The programs of sglang.test.test_programs, read from its source: importing sglang at collection would
    import triton before tests/triton/conftest.py switches it to the interpreter (triton decides when a kernel,
    its standard library's included, is decorated)."""
    # tests/install_sglang_client.sh installs it (the test command does)
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        return []
    source = pathlib.Path(spec.origin).parent / "test" / "test_programs.py"
    return sorted(
        node.name
        for node in ast.parse(source.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    )


ALL_PROGRAMS = program_names()
PROGRAMS = [name for name in ALL_PROGRAMS if name not in NEEDS_IMAGES | NEEDS_OPENAI_BACKEND]
needs_client = pytest.mark.skipif(
    not ALL_PROGRAMS, reason="sglang is not installed: run tests/install_sglang_client.sh"
)


@pytest.fixture(scope="module")
def sgl():
    return importlib.import_module("sglang")


ADMIN_KEY = "sglang-client-admin-key"  # the profiler's; the routes SGLang's client uses stay open
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sglang-client")
    srv = ServerProcess(["--admin-api-key", ADMIN_KEY, "--profile-dir", str(tmp / "profiles")], tmp)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def backend(server, sgl):
    endpoint = sgl.RuntimeEndpoint(server.url)
    # The programs read `default_backend.endpoint` (an sgl.Runtime): the same shape, pointing at our server.
    runtime = types.SimpleNamespace(endpoint=endpoint)
    sgl.set_default_backend(runtime)
    yield endpoint
    sgl.set_default_backend(None)


@pytest.fixture
def returned_states(monkeypatch, sgl):
    """Every state a program's run/run_batch/call returned, for the knowledge-bound checks."""
    from sglang.lang import ir

    states = []
    for method in ("run", "run_batch", "__call__"):
        original = getattr(ir.SglFunction, method)

        def recording(self, *args, __original=original, **kwargs):
            out = __original(self, *args, **kwargs)
            states.extend(out if isinstance(out, list) else [out])
            return out

        monkeypatch.setattr(ir.SglFunction, method, recording)
    return states


@pytest.fixture
def local_tokenizer_loader(monkeypatch, model_dir):
    """test_gen_min_new_tokens loads the tokenizer named by /get_model_info's model_path through
    sglang.srt.utils.hf_transformers_utils, whose imports need torchvision (absent for CPU torch on the
    registry): transformers' loader stands in. The server names no path to a client (#56.7: its
    model_path is the served model name), so the client loads its own copy of that model, as a client
    of a remote server does (SGLang's servers name a hub id there, which a client downloads)."""
    from transformers import AutoTokenizer

    def get_tokenizer(path, **kw):
        assert "/" not in path, path  # the served name, no path of the server's
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)

    shim = types.ModuleType("sglang.srt.utils.hf_transformers_utils")
    shim.get_tokenizer = get_tokenizer
    monkeypatch.setitem(sys.modules, "sglang.srt.utils.hf_transformers_utils", shim)


@needs_client
def test_client_version(sgl):
    assert len(ALL_PROGRAMS) == 19 and len(PROGRAMS) == 16  # what the checked version holds
    assert sgl.__version__ == CHECKED_VERSION


@needs_client
@pytest.mark.parametrize("name", PROGRAMS)
def test_program(name, backend, server, returned_states, local_tokenizer_loader):
    from sglang.test import test_programs

    program = getattr(test_programs, name)
    kwargs = (
        {"check_answer": False} if "check_answer" in inspect.signature(program).parameters else {}
    )
    try:
        program(**kwargs)
    except (AssertionError, json.JSONDecodeError) as e:
        if name not in KNOWLEDGE_BOUND or not failed_on_knowledge(name, e, test_programs.__file__):
            raise
        KNOWLEDGE_BOUND[name](returned_states)
    # the interpreter turns a failed request into a warning and an error on the state: none may have one
    errors = [state.error() for state in returned_states if state.error() is not None]
    assert not errors, errors
    assert "Traceback" not in server.log()


# ---------------------------------------------------------------- the parameters and routes behind the client,
# over raw HTTP; expected texts computed independently with the tokenizer from the same request run without
# the parameter
PROMPT = "Once upon a time, in a small village by the sea, there lived"


def generate(server, sampling_params, **body):
    res = httpx.post(
        server.url + "/generate",
        json={"text": PROMPT, "sampling_params": sampling_params, **body},
        timeout=300,
    )
    return res


def stream(server, sampling_params, **body) -> list[dict]:
    with httpx.stream(
        "POST",
        server.url + "/generate",
        json={"text": PROMPT, "sampling_params": sampling_params, "stream": True, **body},
        timeout=300,
    ) as res:
        assert res.status_code == 200
        events = sse_events(list(res.iter_lines()))
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


GREEDY = {"temperature": 0, "max_new_tokens": 40}


def test_stop_regex_stops_at_the_token_completing_the_first_match(server, tokenizer):
    free = generate(server, GREEDY).json()
    pattern = r"[a-z]{5} [a-z]"  # a five-letter word and the next word's first letter
    ids = free["output_ids"]
    texts = [tokenizer.decode(ids[:k]) for k in range(1, len(ids) + 1)]
    k = next((k for k, t in enumerate(texts, 1) if re.search(pattern, t)), None)
    assert k is not None, f"precondition: the free text has a match: {free['text']!r}"
    out = generate(server, {**GREEDY, "stop_regex": pattern}).json()
    assert out["output_ids"] == ids[:k]
    assert out["text"] == texts[k - 1]  # the match stays in the text (SGLang does not trim a regex)
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    streamed = stream(server, {**GREEDY, "stop_regex": [r"\d{9}", pattern]})
    assert streamed[-1]["text"] == texts[k - 1]


def test_no_stop_trim_keeps_the_stop_string(server):
    free = generate(server, GREEDY).json()["text"]
    word = free.split()[3]
    trimmed = generate(server, {**GREEDY, "stop": word}).json()
    kept = generate(server, {**GREEDY, "stop": word, "no_stop_trim": True}).json()
    assert trimmed["text"] == free[: free.index(word)]
    assert kept["text"] == free[: free.index(word) + len(word)]
    assert kept["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}


def test_streamed_logprobs_are_per_chunk_with_running_totals(server):
    params = {**GREEDY, "max_new_tokens": 24}
    whole = generate(server, params, return_logprob=True).json()["meta_info"]
    chunks = stream(server, params, return_logprob=True)
    collected = []
    for chunk in chunks:
        meta = chunk["meta_info"]
        collected += meta["output_token_logprobs"]
        assert meta["output_token_logprobs_length"] == meta["completion_tokens"] == len(collected)
    assert [x[1] for x in collected] == [x[1] for x in whole["output_token_logprobs"]]
    assert [x[0] for x in collected] == pytest.approx(
        [x[0] for x in whole["output_token_logprobs"]], abs=1e-4
    )
    # a chunk's text is the text so far
    assert chunks[-1]["text"] == generate(server, params).json()["text"]


def test_stream_interval_sends_a_chunk_every_k_tokens(server):
    chunks = stream(server, {**GREEDY, "max_new_tokens": 21, "stream_interval": 4})
    counts = [len(c["output_ids"]) for c in chunks]
    assert counts[-1] == 21
    # every chunk but the last: >= 4 new
    assert all(b - a >= 4 for a, b in zip([0] + counts[:-2], counts[:-1]))
    assert len(chunks) <= 21 // 4 + 1


def test_profile_routes_write_a_trace(server, tmp_path):
    outside = {"output_dir": str(tmp_path)}  # not inside --profile-dir
    res = httpx.post(server.url + "/start_profile", json=outside, headers=ADMIN, timeout=60)
    assert res.status_code == 400 and res.json()["error"]["param"] == "output_dir", res.text
    out_dir = server.tmp_dir / "profiles" / "run"
    body = {"output_dir": str(out_dir)}
    res = httpx.post(server.url + "/start_profile", json=body, headers=ADMIN, timeout=60)
    assert res.status_code == 200, res.text
    # already running
    assert httpx.post(server.url + "/start_profile", headers=ADMIN, timeout=60).status_code == 400
    # POST only (SGLang's also answer GET): a web page's GET cannot drive the profiler
    assert httpx.get(server.url + "/stop_profile", headers=ADMIN, timeout=60).status_code == 405
    assert httpx.post(server.url + "/stop_profile", timeout=60).status_code == 401
    assert generate(server, {**GREEDY, "max_new_tokens": 4}).status_code == 200
    res = httpx.post(server.url + "/stop_profile", headers=ADMIN, timeout=120)
    assert res.status_code == 200, res.text
    traces = list(out_dir.glob("radixrt-*.trace.json"))
    assert len(traces) == 1 and json.loads(traces[0].read_text())["traceEvents"]
    not_running = httpx.post(server.url + "/stop_profile", headers=ADMIN, timeout=60)
    assert not_running.status_code == 400


def test_concate_and_append_request(server):
    ok = httpx.post(
        server.url + "/concate_and_append_request", json={"src_rids": ["a", "b"], "dst_rid": "c"}
    )
    assert ok.status_code == 200 and ok.json()["success"] is True
    bad = httpx.post(
        server.url + "/concate_and_append_request", json={"src_rids": "a", "dst_rid": "c"}
    )
    assert bad.status_code == 400 and "src_rids" in bad.text


@pytest.mark.parametrize(
    "params, field",
    [
        ({"beam_width": 3, "stop": "x"}, "stop"),
        ({"stop_regex": "(?=x)"}, "stop_regex"),
        ({"no_such_param": 1}, "no_such_param"),
        ({"regex": "", "min_new_tokens": 1}, "min_new_tokens"),  # #35: a 400
        ({"ebnf": 'root ::= ""', "min_new_tokens": 1}, "min_new_tokens"),
    ],
)
def test_refused_parameters_are_400s_naming_them(server, params, field):
    res = generate(server, params)
    assert res.status_code == 400 and field in res.text
    # and the server goes on
    assert generate(server, {**GREEDY, "max_new_tokens": 2}).status_code == 200


WEATHER_TAG = {
    "type": "structural_tag",
    "triggers": ["<function="],
    "structures": [
        {
            "begin": "<function=get_weather>",
            "end": "</function>",
            # a code the examples never show: unconstrained, the model would copy the examples' shape ("Paris")
            "schema": {
                "type": "object",
                "properties": {"city": {"enum": ["PAR-75", "LYS-69"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        }
    ],
}
FEW_SHOT_CALLS = (
    'Q: weather in Rome?\nA: <function=get_weather>{"city": "Rome"}</function>\n'
    'Q: weather in Oslo?\nA: <function=get_weather>{"city": "Oslo"}</function>\n'
    "Q: weather in Paris?\nA:"
)


def test_structural_tag_constrains_the_tagged_segment(server):
    import jsonschema

    def run(params):
        return httpx.post(
            server.url + "/generate",
            json={
                "text": FEW_SHOT_CALLS,
                "sampling_params": {
                    "temperature": 0,
                    "max_new_tokens": 40,
                    "stop": ["\nQ:"],
                    **params,
                },
            },
            timeout=300,
        ).json()["text"]

    free = run({})
    # precondition: the model calls, unconstrained
    assert "<function=get_weather>" in free and "PAR-75" not in free
    text = run({"structural_tag": json.dumps(WEATHER_TAG)})
    calls = re.findall(r"<function=(.*?)</function>", text, re.S)
    assert calls and text.count("<function=") == len(calls), text
    for call in calls:
        assert call.startswith("get_weather>"), text
        jsonschema.validate(
            json.loads(call[len("get_weather>") :]), WEATHER_TAG["structures"][0]["schema"]
        )
    bad = httpx.post(
        server.url + "/generate",
        json={
            "text": "x",
            "sampling_params": {
                "structural_tag": json.dumps({"type": "structural_tag", "format": {}})
            },
        },
        timeout=60,
    )
    assert bad.status_code == 400 and "structural_tag" in bad.text
