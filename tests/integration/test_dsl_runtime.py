"""The same programs through `Runtime` (a `radixrt serve` subprocess, over HTTP) give the
same results as through the in-process Engine at temperature 0."""

from __future__ import annotations

import pytest
from dsl_shared import engine_backend, runtime_available
from test_dsl_engine import check_every_primitive, every_primitive

import radixrt as sgl

pytestmark = pytest.mark.skipif(not runtime_available(), reason="radixrt serve is not available")


@pytest.fixture(scope="module")
def runtime():
    with sgl.Runtime(launch_timeout=600, dtype="float32") as rt:
        yield rt


@sgl.function
def tree(s, question):
    s += sgl.user(question)
    s += sgl.assistant_begin()
    forks = s.fork(2)
    forks += lambda i: f"Idea {i + 1}:" + sgl.gen("idea", max_tokens=10, stop="\n")
    forks.join()
    s += "Best: " + sgl.select(
        "best", choices=["Idea 1", "Idea 2"], choices_method=sgl.greedy_token_selection
    )
    s += sgl.assistant_end()


def test_every_primitive_same_on_runtime_and_engine(runtime):
    over_http = every_primitive.run(topic="a dog", backend=runtime, temperature=0)
    check_every_primitive(over_http)
    in_process = every_primitive.run(topic="a dog", backend=engine_backend(), temperature=0)
    assert over_http.text() == in_process.text()
    assert over_http["name"] == in_process["name"] and over_http["alive"] == in_process["alive"]


def test_fork_and_select_same_on_runtime_and_engine(runtime):
    question = "How could a city reduce traffic?"
    over_http = tree.run(question=question, backend=runtime, temperature=0)
    in_process = tree.run(question=question, backend=engine_backend(), temperature=0)
    assert over_http["idea"] == in_process["idea"] and over_http["best"] == in_process["best"]
    a = over_http.get_meta_info("best")["input_token_logprobs"]
    b = in_process.get_meta_info("best")["input_token_logprobs"]
    assert [[e[1] for e in x] for x in a] == [[e[1] for e in x] for x in b]
    assert [e[0] for x in a for e in x] == pytest.approx([e[0] for x in b for e in x], abs=1e-4)


def test_streaming_over_http_matches_the_blocking_run(runtime):
    @sgl.function
    def ask(s):
        s += sgl.user("Name three colors.")
        s += sgl.assistant(sgl.gen("answer", max_tokens=16))

    blocking = ask.run(backend=runtime, temperature=0)
    pieces = list(ask.run(backend=runtime, temperature=0, stream=True).text_iter("answer"))
    assert "".join(pieces) == blocking["answer"] and len(pieces) > 1


def test_after_shutdown_the_backend_names_the_url(tiny_model_dir):
    # the URL in the error is the point, not what the model says: the session's tiny model
    rt = sgl.Runtime(model_path=tiny_model_dir, launch_timeout=600)
    url = rt.url
    endpoint = rt.endpoint
    rt.shutdown()
    with pytest.raises(ConnectionError, match=url.replace(".", r"\.")):
        endpoint.get_server_info()


def test_gen_n_same_on_runtime_and_engine(runtime):
    @sgl.function
    def samples(s):
        s += "Three colours I like: red,"
        s += sgl.gen("colour", n=3, seed=5, max_tokens=4, temperature=1.0)

    over_http = samples.run(backend=runtime)
    in_process = samples.run(backend=engine_backend())
    assert isinstance(over_http["colour"], list) and len(over_http["colour"]) == 3
    assert over_http["colour"] == in_process["colour"] and over_http.text() == in_process.text()
