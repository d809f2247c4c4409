"""#58: one request edge. Every way in runs the same checks in one order (request/edge.admit: the
Engine and the tokenizer manager; the scheduler's intake runs check_request on what crossed the
socket), each rule's words appear once in the package, and RequestOptions is never rebuilt.

Truths: the order the issue fixes (sampling, stop rules, constraint, prompt, LoRA, session, cache
salt, the prefill-decode split); the scheduler's own refusal (a real Scheduler over FakeRunner) of a
message built without the edge; the package's source text."""

from __future__ import annotations

import asyncio
import pathlib
import re
import threading

import pytest
from fake_runner import FakeRunner
from test_scheduler import VOCAB

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.core.scheduler import Scheduler
from radixrt.runtime.messages import TokenizedGenerateReq
from radixrt.runtime.request.edge import EdgeRules, admit
from radixrt.runtime.request.options import Bootstrap, RequestOptions
from radixrt.runtime.request.prompt_checks import EdgeLimits
from radixrt.runtime.request.request_error import RequestError
from radixrt.runtime.serving.http.protocol import APIError
from radixrt.runtime.serving.http.tenants import CompileShares
from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager

CONTEXT = 256
RULES = EdgeRules(EdgeLimits(VOCAB, CONTEXT, 4000), loras=("a",))
PROMPT = [3, 4, 5]
ROOM = Bootstrap("h", 8998, 7)
PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "radixrt"


def bad_validator(kind, spec):
    raise ValueError(f"{kind} will not compile")


def never(kind, spec):
    raise AssertionError(f"nothing here compiles, yet {kind} was validated")


def refused(prompt, params, options, rules=RULES, validate=never) -> str:
    """The field the edge names for one prompt."""
    with pytest.raises(RequestError) as e:
        admit([prompt], [params], [options], rules, new_rid=lambda: "r", validate=validate)
    return e.value.param


# each case is bad in one field and in every field the edge checks after it: the first is named
ORDER = [
    ("max_new_tokens", {"max_new_tokens": -3, "regex": "x"}, PROMPT, {}, bad_validator),
    ("stop_regex", {"stop_regex": "a", "regex": "x"}, [VOCAB + 1], {}, bad_validator),
    ("regex", {"regex": "x"}, [VOCAB + 1], {"lora": "zz"}, bad_validator),
    ("input_ids", {}, [VOCAB + 1], {"lora": "zz"}, never),
    ("lora_path", {}, PROMPT, {"lora": "zz", "session_id": "s" * 200}, never),
    ("session_id", {}, PROMPT, {"session_id": "s" * 200, "cache_salt": ""}, never),
    ("cache_salt", {}, PROMPT, {"cache_salt": ""}, never),
]


@pytest.mark.parametrize("field,params,prompt,fields,validate", ORDER)
def test_the_first_bad_field_in_the_edges_order_is_named(field, params, prompt, fields, validate):
    assert refused(prompt, params, RequestOptions(**fields), validate=validate) == field


def test_the_split_is_checked_last_and_on_every_prompt():
    decode = EdgeRules(RULES.limits, disaggregation_mode="decode")
    assert refused(PROMPT, {}, RequestOptions(cache_salt=""), decode) == "cache_salt"
    assert refused(PROMPT, {}, RequestOptions(), decode) == "bootstrap_room"
    assert refused(PROMPT, {"n": 2}, RequestOptions(bootstrap=ROOM), decode) == "n"
    with pytest.raises(RequestError) as e:  # two prompts: one room names one prompt's KV
        opts = [RequestOptions(bootstrap=ROOM)] * 2
        admit([PROMPT] * 2, [{}] * 2, opts, decode, new_rid=lambda: "r", validate=never)
    assert e.value.param == "bootstrap_room"


def test_a_session_takes_one_prompt_and_one_sequence():
    session = RequestOptions(session_id="s1")
    assert refused(PROMPT, {"n": 2}, session) == "session_id"
    assert refused(PROMPT, {"beam_width": 2}, session) == "session_id"
    with pytest.raises(RequestError) as e:
        admit([PROMPT] * 2, [{}] * 2, [session] * 2, RULES, new_rid=lambda: "r", validate=never)
    assert e.value.param == "session_id"


def test_a_sampling_dict_is_checked_once_per_object_and_compiled_through_the_validator():
    calls = []
    shared = {"regex": "[ab]+", "stop_regex": ["z+"], "n": 2}
    rids = iter(range(100))
    out = admit(
        [PROMPT, PROMPT + [6], PROMPT],
        [shared, shared, dict(shared)],
        [RequestOptions()] * 3,
        RULES,
        new_rid=lambda: f"r{next(rids)}",
        validate=lambda kind, spec: calls.append((kind, spec)),
    )
    assert calls == [("stop_regex", ["z+"]), ("regex", "[ab]+")] * 2  # two distinct objects
    assert [[r.rid for r in copies] for copies in out] == [
        ["r0-0", "r0-1"],
        ["r1-0", "r1-1"],
        ["r2-0", "r2-1"],
    ]
    with pytest.raises(RequestError) as e:
        admit(
            [PROMPT],
            [{"json_schema": "{}"}],
            [RequestOptions()],
            RULES,
            new_rid=str,
            validate=bad_validator,
        )
    assert e.value.param == "json_schema"
    assert str(e.value) == "invalid json_schema: json_schema will not compile"


def test_the_logprob_volume_counts_the_body_together():
    one = {"max_new_tokens": 40}
    options = RequestOptions(return_logprob=True, logprob_start_len=0, top_logprobs_num=20)
    limits = EdgeLimits(VOCAB, 4096, 1 << 20)
    rules = EdgeRules(limits)
    prompt = [3] * 1000  # (1000 + 40) x 21 = 21,840 items a prompt; 2^17 = 131,072
    admit([prompt] * 6, [one] * 6, [options] * 6, rules, new_rid=lambda: "r", validate=never)
    with pytest.raises(RequestError) as e:
        admit([prompt] * 7, [one] * 7, [options] * 7, rules, new_rid=lambda: "r", validate=never)
    assert e.value.param == "logprob_start_len"


def scheduler(**cfg) -> Scheduler:
    config = ServerConfig(chunked_prefill_size=64, **cfg)
    return Scheduler(config, FakeRunner(4000, 1, VOCAB, eos=None, max_rows=17, loras=("a",)))


@pytest.mark.parametrize(
    "fields,params",
    [
        ({"lora": "zz"}, {}),
        ({"session_id": "s" * 200}, {}),
        ({"session_id": "s1"}, {"beam_width": 2, "max_new_tokens": 4}),
        ({"cache_salt": ""}, {}),
    ],
)
def test_intake_refuses_what_the_edge_refuses_in_the_same_words(fields, params):
    """A message that never passed the edge (a hostile or buggy sender) meets the same rule at
    intake, with the same words."""
    options = RequestOptions(**fields)
    with pytest.raises(RequestError) as e:
        admit([PROMPT], [params], [options], RULES, new_rid=lambda: "r", validate=never)
    s = scheduler()
    s.add_request(TokenizedGenerateReq("x", PROMPT, params, options))
    (out,) = s.take_outputs()
    assert out.error_status == 400 and out.error == str(e.value)
    assert not s.has_work()


def test_a_decode_server_refuses_a_request_without_a_room_naming_the_missing_field():
    rules = EdgeRules(RULES.limits, disaggregation_mode="decode")
    with pytest.raises(RequestError) as e:
        admit([PROMPT], [{}], [RequestOptions()], rules, new_rid=lambda: "r", validate=never)
    assert "bootstrap_room is required" in str(e.value)


class ThreadRecordingGrammar:
    def __init__(self):
        self.threads = []

    def for_kind(self, kind):
        return self

    def validate(self, kind, spec):
        self.threads.append(threading.current_thread())
        if spec == "(":
            raise ValueError("unbalanced")


def manager() -> TokenizerManager:
    tm = TokenizerManager.__new__(TokenizerManager)  # the edge alone: no sockets, no model
    tm.config = ServerConfig()
    tm._grammar, tm._compiles = ThreadRecordingGrammar(), CompileShares(limit=2)
    tm._rid_prefix, tm._rid_counter = "t", iter(range(100))
    tm.scheduler = type(
        "S",
        (),
        {
            "model_info": {"vocab_size": VOCAB, "context_length": CONTEXT},
            "startup_server_info": {"max_total_tokens": 4000, "page_size": 1},
            "lora_adapters": {"a": 1},
        },
    )()
    return tm


def test_the_tokenizer_manager_runs_the_same_edge_compiling_off_its_loop():
    tm = manager()

    async def scenario():
        loop_thread = threading.current_thread()
        plain = await tm.admit([PROMPT], [{"max_new_tokens": 2}], [RequestOptions(lora="a")])
        assert [r.rid for r in plain[0]] == ["t-0"] and tm._grammar.threads == []
        await tm.admit([PROMPT], [{"regex": "a"}], [RequestOptions(client="c")])
        assert tm._grammar.threads and loop_thread not in tm._grammar.threads
        assert tm._compiles.held("c") == 0  # its share back
        for params, options, field in [
            ({"regex": "("}, RequestOptions(), "regex"),
            ({}, RequestOptions(lora="zz"), "lora_path"),
            ({"n": 2}, RequestOptions(session_id="s"), "session_id"),
        ]:
            with pytest.raises(APIError) as e:
                await tm.admit([PROMPT], [params], [options])
            assert e.value.status == 400 and e.value.param == field

    asyncio.run(scenario())


RULE_WORDS = [
    "is not loaded (loaded:",
    "session_id must be a string",
    "needs a single prompt",
    "cache_salt must be a string",
    "is required (sglang-router",
    "takes one sequence per request",
    "are not served with disaggregation",
    "tokens of KV (prompt {n} + max_new_tokens)",
]


@pytest.mark.parametrize("words", RULE_WORDS)
def test_each_rule_is_worded_once_in_the_package(words):
    found = [
        str(f.relative_to(PACKAGE))
        for f in PACKAGE.rglob("*.py")
        for _ in range(f.read_text().count(words))
    ]
    assert len(found) == 1, (words, found)


def test_request_options_are_never_rebuilt_after_they_are_built():
    replaced = [
        f"{f.relative_to(PACKAGE)}:{n}"
        for f in PACKAGE.rglob("*.py")
        for n, line in enumerate(f.read_text().splitlines(), 1)
        if re.search(r"replace\(\s*[\w.]*options\b", line)
    ]
    assert replaced == []
