"""ThreadLink: core's KVLink (core/pd_link.py) over a transfer agent thread. Commands go to the
agent and events come back over two inproc PAIR sockets; the scheduler loop polls `event_socket`
beside its own, so an arrival wakes it at once."""

from __future__ import annotations

import itertools
import socket
from typing import Any

import orjson
import zmq

from radixrt.runtime.core.pd_link import Bootstrap, KVArrived, KVFailed, KVSent
from radixrt.runtime.disaggregation.agent import Agent
from radixrt.runtime.disaggregation.decode_agent import DecodeAgent
from radixrt.runtime.disaggregation.kv_layout import KVLayout
from radixrt.runtime.disaggregation.mooncake_engine import MooncakeEngine
from radixrt.runtime.disaggregation.page_stager import PageStager
from radixrt.runtime.disaggregation.prefill_agent import PrefillAgent

_names = itertools.count()


class ThreadLink:
    def __init__(self, ctx: zmq.Context):
        n = next(_names)
        self.ctx = ctx
        self.cmd_addr, self.evt_addr = f"inproc://kv-cmd-{n}", f"inproc://kv-evt-{n}"
        self.cmd = ctx.socket(zmq.PAIR)
        self.cmd.bind(self.cmd_addr)
        self.event_socket = ctx.socket(zmq.PAIR)
        self.event_socket.bind(self.evt_addr)
        self.agent: Agent | None = None
        self.engine: Any = None

    def start(self, agent: Agent) -> None:
        self.agent = agent
        agent.start()

    def _command(self, op: str, **fields: Any) -> None:
        self.cmd.send(orjson.dumps({"op": op, **fields}))

    def send(self, room: int, page_ids: list[int], first: dict[str, Any]) -> None:
        self._command("send", room=room, pages=page_ids, first=first)

    def drop(self, room: int, error: str) -> None:
        self._command("drop", room=room, error=error)

    def expect(self, bootstrap: Bootstrap, page_ids: list[int], start_page: int) -> None:
        self._command(
            "expect", room=bootstrap.room, addr=bootstrap.addr, pages=page_ids, start=start_page
        )

    def cancel(self, bootstrap: Bootstrap) -> None:
        self._command("cancel", room=bootstrap.room, addr=bootstrap.addr)

    def events(self) -> list[KVSent | KVArrived | KVFailed]:
        out: list[KVSent | KVArrived | KVFailed] = []
        while True:
            try:
                ev = orjson.loads(self.event_socket.recv(zmq.NOBLOCK))
            except zmq.Again:
                return out
            kind = ev.pop("kind")
            out.append({"sent": KVSent, "arrived": KVArrived, "failed": KVFailed}[kind](**ev))

    @property
    def alive(self) -> bool:
        return self.agent is not None and self.agent.is_alive()

    def close(self) -> None:
        if self.agent is not None and self.agent.is_alive():
            self._command("close")
            self.agent.join(timeout=5)
        self.cmd.close(linger=0)
        self.event_socket.close(linger=0)


def reachable_host(host: str) -> str:
    """The address a peer reaches this server at: --host, or this machine's when it binds all."""
    if host in ("0.0.0.0", "::", ""):
        return socket.gethostbyname(socket.gethostname())
    return socket.gethostbyname(host)


def make_link(config: Any, runner: Any) -> ThreadLink:
    """The link of a --disaggregation-mode prefill|decode server: Mooncake's engine on this
    server's host with the KV pool registered, and the side's agent started."""
    host = reachable_host(config.host)
    engine = MooncakeEngine(host, config.disaggregation_ib_device)
    tensors = runner.kv.tensors()
    engine.register(tensors)
    layout = KVLayout.of_pool(tensors, runner.page_size)
    stager = PageStager(tensors, runner.page_size, engine)
    link = ThreadLink(zmq.Context.instance())
    link.engine = engine  # the engine serves the registered memory for as long as it lives
    timeout = config.disaggregation_transfer_timeout
    if config.disaggregation_mode == "prefill":
        bind_host = "*" if config.host in ("0.0.0.0", "::") else host
        bind = f"tcp://{bind_host}:{config.disaggregation_bootstrap_port}"
        try:
            agent = PrefillAgent(
                link.ctx, link.cmd_addr, link.evt_addr, timeout, engine, layout, stager, bind
            )
        except Exception:
            link.close()
            raise
    else:
        agent = DecodeAgent(
            link.ctx, link.cmd_addr, link.evt_addr, timeout, engine.session, layout, stager
        )
    link.start(agent)
    return link
