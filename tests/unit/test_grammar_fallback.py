"""`--grammar-backend auto` (constrained/fallback.py, choose.py): llguidance first, outlines for what llguidance
refuses or fails to compile, the choice remembered per grammar (the shadow that steers llguidance's requests:
tests/unit/test_budget_steering.py). Fake backends record every call, so
the test sees which backend served what and that nothing asks llguidance twice for a grammar it refused."""

from __future__ import annotations

import pytest

from radixrt.runtime.constrained.choose import BackendChooser
from radixrt.runtime.constrained.fallback import FallbackBackend
from radixrt.runtime.constrained.regex_builder import GrammarError


class Done:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def done(self):
        return True

    def result(self):
        if self.error:
            raise self.error
        return self.value


class Pending:
    """Done only once released (a compile still running)."""

    def __init__(self, then):
        self.then, self.released = then, False

    def done(self):
        return self.released

    def result(self):
        assert self.released
        return self.then.result()


class FakeBackend:
    def __init__(self, name, refuses=(), fails_compile=(), pending=False):
        self.name, self.refuses, self.fails_compile, self.pending = (
            name,
            set(refuses),
            set(fails_compile),
            pending,
        )
        self.calls: list[tuple[str, str]] = []
        self.cached_bytes = 0
        self.futures = []

    def validate(self, kind, spec):
        self.calls.append(("validate", spec))
        if spec in self.refuses:
            raise GrammarError(f"{self.name} refuses {spec}")

    def request(self, kind, spec):
        self.calls.append(("request", spec))
        if spec in self.refuses or spec in self.fails_compile:
            fut = Done(error=GrammarError(f"{self.name} cannot compile {spec}"))
        else:
            fut = Done(value=(self.name, spec))
        if self.pending:
            fut = Pending(fut)
            self.futures.append(fut)
        return fut

    def shutdown(self):
        self.calls.append(("shutdown", ""))


def wait(fut):
    assert fut.done()
    return fut.result()


def test_llguidance_serves_what_it_can():
    llg, outlines = FakeBackend("llguidance"), FakeBackend("outlines")
    auto = FallbackBackend(llg, outlines)
    auto.validate("regex", "a+")
    assert wait(auto.request("regex", "a+")) == ("llguidance", "a+")
    assert outlines.calls == []


def test_a_refusal_goes_to_outlines_and_is_remembered():
    llg, outlines = FakeBackend("llguidance", refuses={"not"}), FakeBackend("outlines")
    auto = FallbackBackend(llg, outlines)
    auto.validate("regex", "not")
    assert wait(auto.request("regex", "not")) == ("outlines", "not")
    n = len(llg.calls)
    assert wait(auto.request("regex", "not")) == ("outlines", "not")
    auto.validate("regex", "not")
    assert len(llg.calls) == n, "a grammar llguidance failed on went to llguidance again"


def test_a_failed_compile_falls_back_only_once_it_has_failed():
    llg = FakeBackend("llguidance", fails_compile={"huge"}, pending=True)
    outlines = FakeBackend("outlines")
    auto = FallbackBackend(llg, outlines)
    fut = auto.request("regex", "huge")
    assert not fut.done() and outlines.calls == [], "outlines asked before llguidance gave up"
    llg.futures[-1].released = True
    assert wait(fut) == ("outlines", "huge")


def test_both_refusing_names_both_reasons():
    auto = FallbackBackend(
        FakeBackend("llguidance", refuses={"x"}), FakeBackend("outlines", refuses={"x"})
    )
    with pytest.raises(GrammarError, match="llguidance refuses x.*outlines: outlines refuses x"):
        auto.validate("regex", "x")
    with pytest.raises(
        GrammarError, match="llguidance cannot compile x.*outlines: outlines cannot compile x"
    ):
        wait(auto.request("regex", "x"))


def test_a_grammar_llguidance_refuses_is_refused_not_sent_to_outlines():
    fb = FallbackBackend(
        FakeBackend("llguidance", refuses=("root ::= x",)), FakeBackend("outlines"), shadow=True
    )
    with pytest.raises(GrammarError, match="llguidance") as err:
        wait(fb.request("ebnf", "root ::= x"))
    assert "outlines" not in str(err.value) and fb.secondary.calls == []
    with pytest.raises(GrammarError, match="llguidance refuses"):
        fb.validate("ebnf", "root ::= x")
    assert fb.secondary.calls == []


def test_chooser_auto_and_explicit_backends():
    made = {}

    def make(name):
        made[name] = FakeBackend(name)
        return made[name]

    auto = BackendChooser("auto", make)
    assert isinstance(auto.for_kind("json_schema"), FallbackBackend)
    assert auto.for_kind("json_schema").primary is made["llguidance"], (
        "auto: schemas go to llguidance first"
    )
    assert auto.for_kind("json_schema").shadow, "and outlines' DFA steers them"
    assert auto.for_kind("tool_call_grammar").primary is made["outlines"], (
        "our own regexes: outlines first"
    )
    cfg = auto.for_kind("ebnf")
    assert cfg.primary is made["llguidance"] and cfg.shadow, (
        "a grammar: llguidance, steered by a regular subset"
    )
    ebnf = BackendChooser("outlines", make).for_kind("ebnf")
    assert ebnf.primary is made["llguidance"] and ebnf.shadow and not ebnf.fallback, (
        "outlines cannot enforce it"
    )
    steered = BackendChooser("llguidance", make).for_kind("json_schema")
    assert (
        steered.primary.name == "llguidance"
        and steered.shadow
        and not steered.fallback
        and steered.name == "llguidance"
    ), "llguidance alone serves, an outlines shadow steers"
    assert sorted(b.name for b in auto.built()) == ["llguidance", "outlines"]
    made.clear()
    only = BackendChooser("outlines", make)
    assert only.for_kind("json_schema") is made["outlines"] and "llguidance" not in made
    with pytest.raises(ValueError, match="unknown grammar backend"):
        BackendChooser("lm-format-enforcer", make)
