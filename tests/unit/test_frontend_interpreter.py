"""The interpreter against a scripted fake runtime: order, variables, roles, fork/join,
pins, errors pointing at the user's line, streaming, run_batch."""

from __future__ import annotations

import json
import threading
import traceback

import pytest
from frontend_fake_backend import SMOLLM_TEMPLATE, FakeBackend

import radixrt as sgl
from radixrt.frontend.chat_template import from_jinja

SYS = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def test_text_and_gen_in_order_and_prompts_carry_the_whole_text():
    be = FakeBackend(rules=[("Q2:", " two"), ("Q1:", " one")])

    @sgl.function
    def prog(s, a):
        s += "Q1:" + sgl.gen("x", max_tokens=5, stop="\n")
        s += " Q2:" + a + sgl.gen("y", max_tokens=5)

    state = prog.run(a="!", backend=be, temperature=0)
    assert state["x"] == " one" and state["y"] == " two"
    assert state.text() == "Q1: one Q2:! two"
    assert [r["prompt"] for r in be.log] == ["Q1:", "Q1: one Q2:!"]
    first = be.log[0]["sampling"]
    assert first["max_new_tokens"] == 5 and first["stop"][0] == "\n" and first["temperature"] == 0
    assert be.log[1]["sampling"]["max_new_tokens"] == 5
    # every request of a run carries the same program id
    assert (
        len({r["program_id"] for r in be.log}) == 1 and be.log[0]["program_id"] == state.program_id
    )


def test_run_defaults_and_gen_overrides_merge():
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += "a" + sgl.gen("x")
        s += "b" + sgl.gen("y", temperature=0.5, max_tokens=3, top_k=4, regex="[ab]+")

    prog.run(backend=be, max_new_tokens=7, temperature=0.1, top_p=0.9, stop=["END"])
    x, y = be.log[0]["sampling"], be.log[1]["sampling"]
    assert (x["max_new_tokens"], x["temperature"], x["top_p"]) == (7, 0.1, 0.9) and "END" in x[
        "stop"
    ]
    assert (y["max_new_tokens"], y["temperature"], y["top_k"], y["regex"]) == (3, 0.5, 4, "[ab]+")


def test_dtype_json_schema_and_typed_gens_compile_to_constraints():
    be = FakeBackend(rules=[("n=", "42\n")])
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}

    @sgl.function
    def prog(s):
        s += "n=" + sgl.gen_int("n")
        s += sgl.gen("j", json_schema=schema)
        s += sgl.gen_string("t")

    state = prog.run(backend=be)
    assert state["n"] == "42"  # trimmed at the "\n" stop
    assert (
        be.log[0]["sampling"]["regex"].startswith("[-+]?[0-9]+")
        and "\n" in be.log[0]["sampling"]["stop"]
    )
    assert json.loads(be.log[1]["sampling"]["json_schema"]) == schema
    assert be.log[2]["sampling"]["regex"].startswith('\\"')
    with pytest.raises(ValueError, match="dtype"):
        sgl.gen("x", dtype=list)
    with pytest.raises(ValueError, match="regex"):
        sgl.gen("x", regex="(")
    with pytest.raises(ValueError, match="one of"):
        sgl.gen("x", regex="a", json_schema=schema)


def test_roles_render_like_the_chat_template():
    be = FakeBackend(rules=[("user\nHi", "Hello!")])

    @sgl.function
    def chat(s):
        s += sgl.user("Hi")
        s += sgl.assistant(sgl.gen("a", max_tokens=8))
        with s.user():
            s += "More"
        s += sgl.assistant_begin() + "Sure" + sgl.assistant_end()

    state = chat.run(backend=be)
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "More"},
        {"role": "assistant", "content": "Sure"},
    ]
    # the truth: the Jinja template itself rendered on the whole conversation
    import jinja2

    truth = (
        jinja2.Environment()
        .from_string(SMOLLM_TEMPLATE)
        .render(messages=messages, add_generation_prompt=False)
    )
    assert state.text() == truth
    assert state.messages()[0]["role"] == "system" and state.messages()[1:] == messages
    assert be.log[0]["prompt"] == SYS + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert "<|im_end|>" in be.log[0]["sampling"]["stop"]


def test_explicit_system_replaces_the_default_one():
    be = FakeBackend()

    @sgl.function
    def chat(s):
        s += sgl.system("Be brief.")
        s += sgl.user("Hi")

    assert (
        chat.run(backend=be).text()
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    )


def test_var_scope_and_state_access():
    be = FakeBackend(rules=[("x:", " X")])

    @sgl.function
    def prog(s):
        with s.var_scope("block"):
            s += "x:" + sgl.gen("g", max_tokens=2)
        s["manual"] = 5
        return s["g"] + "!"

    state = prog.run(backend=be)
    assert state["block"] == "x: X" and state["manual"] == 5 and state.ret_value == " X!"
    assert "g" in state and "nope" not in state
    assert state.get_meta_info("g")["prompt_tokens"] == len(be.tokenize("x:"))
    with pytest.raises(KeyError, match="nope"):
        state["nope"]


def test_backend_error_names_the_users_line_and_releases_pins():
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += "prefix"
        f = s.fork(2)
        f += sgl.gen("x", temperature=-1.0)  # BAD_LINE
        f.join()

    with pytest.raises(sgl.ProgramError) as info:
        prog.run(backend=be)
    err = info.value
    assert "temperature" in str(err) and "BAD_LINE" in str(err) and err.site.function == "prog"
    assert isinstance(err.cause, ValueError)
    assert not be.pins
    frames = traceback.extract_tb(err.__traceback__)
    assert not any("/radixrt/frontend/interpreter.py" in f.filename for f in frames)


def test_error_in_user_code_shows_the_user_frame():
    be = FakeBackend()

    @sgl.function
    def prog(s):
        s += "x"
        return {}["missing"]  # USER_BUG

    with pytest.raises(KeyError) as info:
        prog.run(backend=be)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert frames[-1].name == "prog" and "USER_BUG" in frames[-1].line
    # between the caller's line and the program's line: only the one frame of run()
    assert [f.name for f in frames] == [
        "test_error_in_user_code_shows_the_user_frame",
        "run",
        "prog",
    ]


def test_reading_after_a_failed_gen_raises_and_later_appends_stop_the_program():
    be = FakeBackend()
    reached = []

    @sgl.function
    def prog(s):
        s += sgl.gen("a", temperature=-2.0)
        s.sync()
        reached.append(1)
        s += "more"  # raises: the state has failed
        reached.append(2)

    with pytest.raises(sgl.ProgramError, match="gen\\('a'\\)"):
        prog.run(backend=be)
    assert reached == [1]


def test_trace_stops_at_the_first_dynamic_step():
    be = FakeBackend()

    @sgl.function
    def prog(s, question):
        s += sgl.system("Be nice.")
        s += sgl.user("Q: " + question)
        s += sgl.assistant(sgl.gen("a"))

    result = prog.trace(backend=be)
    assert result.prefix == "<|im_start|>system\nBe nice.<|im_end|>\n<|im_start|>user\nQ: "
    assert prog.trace(backend=be, question="hi").prefix.endswith(
        "Q: hi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_bad_programs_and_arguments():
    with pytest.raises(ValueError, match="first argument"):
        sgl.function(lambda x: None)
    with pytest.raises(TypeError):
        sgl.function(lambda s, a: None).run(b=1, backend=FakeBackend())
    with pytest.raises(ValueError, match="choices"):
        sgl.select("x", choices=[])
    with pytest.raises(NotImplementedError):
        sgl.image("x.png")


def test_nested_roles_are_an_error_at_the_users_line():
    @sgl.function
    def prog(s):
        s += sgl.user_begin()
        s += sgl.assistant("x")  # NESTED

    with pytest.raises(sgl.ProgramError, match="NESTED"):
        prog.run(backend=FakeBackend())


def test_set_default_backend_and_derived_template():
    be = FakeBackend(rules=[("hi", " yo")])
    sgl.set_default_backend(be)
    try:
        assert sgl.function(lambda s: s.__iadd__("hi" + sgl.gen("x"))).run()["x"] == " yo"
    finally:
        sgl.set_default_backend(None)
    assert be.get_chat_template() == from_jinja(SMOLLM_TEMPLATE, "", "<|im_end|>")


def test_many_threads_share_one_backend():
    be = FakeBackend(respond=lambda p, sp: " " + p.split()[-1])

    @sgl.function
    def echo(s, word):
        s += "say " + word + sgl.gen("out", max_tokens=2)

    results = {}

    def worker(i):
        results[i] = echo.run(word=f"w{i}", backend=be)["out"]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f" w{i}" for i in range(16)}
