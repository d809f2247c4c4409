"""LoRA loads in the scheduler process (serving/backend/lora_loads.py): the read runs on a worker thread, so
the loop's call returns at once while it runs; answers come back in arrival order (the scheduler
client pairs them by order); refusals name their field, a read's failure of any kind is the one
text. Truth: a scheduler stand-in whose read blocks until the test releases it, and which records
what was installed."""

from __future__ import annotations

import threading
import time
import types

from radixrt.runtime.messages import LoraAdapterReq
from radixrt.runtime.model.lora_paths import REFUSED, LoraRefused
from radixrt.runtime.serving.backend.lora_loads import LoraLoads


class SlowScheduler:
    def __init__(self):
        self.loaded: list[str] = []
        self.release = threading.Event()
        self.reads: list[str] = []
        self.runner = types.SimpleNamespace(lora_names=lambda: sorted(self.loaded))
        self.admin = self  # the admin calls (Scheduler.admin) are this fake's own

    def check_lora_load(self, name):
        if name in self.loaded:
            raise ValueError(f"lora_name: {name!r} is already loaded")

    def read_lora(self, name, path):
        self.reads.append(name)
        assert self.release.wait(10)
        if path == "bad":
            raise LoraRefused("no adapter_config.json")
        if path == "panic":
            raise BaseException("a native reader's panic")
        return name

    def install_lora(self, adapter):
        self.loaded.append(adapter)

    def unload_lora(self, name):
        if name not in self.loaded:
            raise ValueError(f"no LoRA adapter named {name!r} is loaded")
        self.loaded.remove(name)


def settle(loads, answers, n):
    deadline = time.monotonic() + 10
    while len(answers) < n and time.monotonic() < deadline:
        loads.poll()
        time.sleep(0.005)
    assert len(answers) == n, answers


def test_a_load_is_read_off_the_loop_and_answers_keep_their_order():
    s, answers = SlowScheduler(), []
    loads = LoraLoads(s, answers.append)
    started = time.monotonic()
    loads.submit(LoraAdapterReq("load", "a", "/roots/a"))
    loads.submit(LoraAdapterReq("unload", "a"))  # behind the load: answered after it
    loads.submit(LoraAdapterReq("load", "b", "bad"))
    for _ in range(20):
        loads.poll()  # the loop's polls return at once while the read waits
    # a poll that waited on the read would never return (the read is released below): reaching
    # here is the proof; the bound only keeps a very slow poll visible, loaded machine or not
    assert time.monotonic() - started < 10 and answers == [] and loads.busy
    assert s.reads == ["a"] and s.loaded == []
    s.release.set()
    settle(loads, answers, 3)
    assert [(o.success, o.message) for o in answers[:2]] == [
        (True, "loaded a"),
        (True, "unloaded a"),
    ]
    assert answers[0].adapters == ["a"] and answers[1].adapters == []
    assert not answers[2].success and answers[2].message == REFUSED
    assert answers[2].param == "lora_path" and not loads.busy
    loads.close()


def test_a_refused_name_is_answered_without_a_read_and_a_panic_is_the_one_text():
    s, answers = SlowScheduler(), []
    s.loaded.append("a")
    s.release.set()
    loads = LoraLoads(s, answers.append)
    loads.submit(LoraAdapterReq("load", "a", "/roots/a"))
    assert (
        len(answers) == 1
        and answers[0].param == "lora_name"
        and "already loaded" in answers[0].message
    )
    assert s.reads == []
    loads.submit(LoraAdapterReq("load", "p", "panic"))
    settle(loads, answers, 2)
    assert answers[1].message == REFUSED and not answers[1].success
    loads.submit(LoraAdapterReq("unload", "zz"))
    assert "no LoRA adapter named 'zz'" in answers[2].message
    loads.close()
