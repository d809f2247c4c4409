"""The DSL compatibility suite (dsl_compat_programs.py, SGLang's idioms) on three backends: the in-process
Engine, RuntimeEndpoint over HTTP, and sgl.OpenAI (the `openai` client) against the same server.

Truth: every program runs without an error on each backend it is meant for (sgl.OpenAI refuses what the
OpenAI API cannot carry with NotImplementedError), and where the output is deterministic (T=0) the three
backends produce the same text and variables: one model, three transports.
"""

import pytest
from conftest_server import DEFAULT_SERVER_ARGS
from dsl_compat_programs import PROGRAMS, multi_turn, roles_and_messages
from dsl_shared import engine_backend

import radixrt as sgl

pytestmark = pytest.mark.integration
BACKENDS = ("engine", "runtime", "openai")


@pytest.fixture(scope="module")
def server(shared_servers):
    return shared_servers.get(DEFAULT_SERVER_ARGS)  # float32, as the Engine


@pytest.fixture(scope="module")
def backends(server):
    return {
        "engine": engine_backend(),
        "runtime": sgl.RuntimeEndpoint(server.url),
        "openai": sgl.OpenAI("default", base_url=server.url + "/v1"),
    }


@pytest.fixture(scope="module")
def result(backends):
    """result(name, backend): what PROGRAMS[name] returns on that backend, run on first use and
    remembered for the module (an error it raised is raised again), so each test below passes or
    fails on its own and a full run runs no program twice on one backend."""
    memo: dict[tuple[str, str], tuple[bool, object]] = {}

    def get(name: str, backend: str) -> dict:
        if (name, backend) not in memo:
            run = PROGRAMS[name][0]
            try:
                memo[name, backend] = (True, run(backends[backend]))
            except Exception as e:
                memo[name, backend] = (False, e)
        ok, value = memo[name, backend]
        if not ok:
            raise value
        return value

    return get


def test_the_suite_covers_enough_programs():
    assert len(PROGRAMS) >= 25


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_runs(result, name, backend):
    _, on_openai, _ = PROGRAMS[name]
    if backend == "openai" and not on_openai:
        with pytest.raises(sgl.ProgramError, match="not available on sgl.OpenAI") as failed:
            result(name, backend)
        assert isinstance(failed.value.cause, NotImplementedError)
        return
    assert isinstance(result(name, backend), dict)


@pytest.mark.parametrize(
    "name", [n for n, (_, _, deterministic) in PROGRAMS.items() if deterministic]
)
def test_backends_agree(result, name):
    _, on_openai, _ = PROGRAMS[name]
    compared = [b for b in BACKENDS if b != "openai" or on_openai]
    results = {b: result(name, b) for b in compared}  # run here when not run yet
    first = results["engine"]
    assert isinstance(first, dict), first
    for b in compared[1:]:
        assert results[b] == first, (name, b, results[b], first)


def test_openai_chat_mode_sends_messages(backends, server):
    chat = sgl.OpenAI("default", base_url=server.url + "/v1", is_chat_model=True)
    for program, kwargs in (
        (roles_and_messages, {}),
        (multi_turn, {"q1": "Hi!", "q2": "Name a colour."}),
    ):
        via_chat = program.run(backend=chat, **kwargs)
        on_engine = program.run(backend=backends["engine"], **kwargs)
        # the server renders the messages with the same template the DSL renders them with
        assert via_chat.text() == on_engine.text()

    @sgl.function
    def gen_outside_assistant(s):
        s += sgl.user("Hi") + "Then:" + sgl.gen("x", max_tokens=2)

    with pytest.raises(sgl.ProgramError, match="assistant's turn"):
        gen_outside_assistant.run(backend=chat)


@sgl.function
def fork_with_offsets(s):
    s += "x"
    s.fork(2, position_ids_offset=[0, 0])


def test_unsupported_constructs_say_so():
    with pytest.raises(NotImplementedError, match="image"):
        sgl.image("cat.png")
    with pytest.raises(NotImplementedError, match="video"):
        sgl.video("clip.mp4", num_frames=4)
    with pytest.raises(NotImplementedError, match="position_ids_offset"):
        fork_with_offsets.run(backend=engine_backend())
    with pytest.raises(NotImplementedError, match="flush_cache"):
        sgl.OpenAI("default", base_url="http://127.0.0.1:9/v1").flush_cache()
