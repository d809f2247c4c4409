"""ThreadTransfer: core's KVTransfer (core/kv_transfer.py) over a transfer agent thread. Commands
go to the agent and events come back over two inproc PAIR sockets (wire.Command and wire.Event
Structs, as JSON); the scheduler loop polls `event_socket` beside its own, so an arrival wakes it at
once."""

from __future__ import annotations

import itertools
from typing import Any

import zmq

from radixrt.runtime.core.kv_transfer import KVArrived, KVFailed, KVSent
from radixrt.runtime.disaggregation.agent import Agent
from radixrt.runtime.disaggregation.decode_agent import DecodeAgent
from radixrt.runtime.disaggregation.kv_layout import KVLayout
from radixrt.runtime.disaggregation.page_bytes import PageBytes
from radixrt.runtime.disaggregation.prefill_agent import PrefillAgent
from radixrt.runtime.disaggregation.wire import (
    EVENTS,
    CancelCommand,
    CloseCommand,
    Command,
    DropCommand,
    ExpectCommand,
    First,
    SendCommand,
    encode,
)
from radixrt.runtime.request.options import Bootstrap

_names = itertools.count()


class ThreadTransfer:
    def __init__(self, ctx: zmq.Context):
        n = next(_names)
        self.ctx = ctx
        self.cmd_addr, self.evt_addr = f"inproc://kv-cmd-{n}", f"inproc://kv-evt-{n}"
        self.cmd = ctx.socket(zmq.PAIR)
        self.cmd.bind(self.cmd_addr)
        self.event_socket = ctx.socket(zmq.PAIR)
        self.event_socket.bind(self.evt_addr)
        self.agent: Agent | None = None

    def start(self, agent: Agent) -> None:
        self.agent = agent
        agent.start()

    def _command(self, cmd: Command) -> None:
        self.cmd.send(encode(cmd))

    def send(self, room: int, page_ids: list[int], first: dict[str, Any]) -> None:
        # the scheduler's own token, not checked here: the decode side checks what arrives
        self._command(SendCommand(room=room, pages=page_ids, first=First(**first)))

    def drop(self, room: int, error: str) -> None:
        self._command(DropCommand(room=room, error=error))

    def expect(self, bootstrap: Bootstrap, page_ids: list[int], start_page: int) -> None:
        room, addr = bootstrap.room, bootstrap.addr
        self._command(ExpectCommand(room=room, addr=addr, pages=page_ids, start=start_page))

    def cancel(self, bootstrap: Bootstrap) -> None:
        self._command(CancelCommand(room=bootstrap.room, addr=bootstrap.addr))

    def events(self) -> list[KVSent | KVArrived | KVFailed]:
        out: list[KVSent | KVArrived | KVFailed] = []
        while True:
            try:
                data = self.event_socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return out
            out.append(EVENTS.decode(data).core())

    @property
    def alive(self) -> bool:
        return self.agent is not None and self.agent.is_alive()

    def close(self) -> None:
        if self.agent is not None and self.agent.is_alive():
            self._command(CloseCommand())
            self.agent.join(timeout=5)
        self.cmd.close(linger=0)
        self.event_socket.close(linger=0)


def make_transfer(config: Any, runner: Any) -> ThreadTransfer:
    """The KV transfer of a --disaggregation-mode prefill|decode server: the side's agent over this
    server's KV pool, on the channel keyed by --disaggregation-channel-secret."""
    tensors = runner.kv.tensors()
    layout = KVLayout.of_pool(tensors, runner.page_size)
    pages = PageBytes(tensors, runner.page_size)
    link = ThreadTransfer(zmq.Context.instance())
    timeout, secret = config.disaggregation_transfer_timeout, config.disaggregation_channel_secret
    if config.disaggregation_mode == "prefill":
        bind = f"tcp://{bind_host(config.host)}:{config.disaggregation_bootstrap_port}"
        try:
            agent = PrefillAgent(
                link.ctx, link.cmd_addr, link.evt_addr, timeout, layout, pages, secret, bind
            )
        except Exception:
            link.close()
            raise
    else:
        peers = (frozenset(config.prefill_bootstrap_addrs), runner.vocab_size)
        agent = DecodeAgent(
            link.ctx, link.cmd_addr, link.evt_addr, timeout, layout, pages, secret, *peers
        )
    link.start(agent)
    return link


def bind_host(host: str) -> str:
    """The bootstrap port binds --host, as the HTTP port does (a wildcard binds every interface)."""
    if host in ("0.0.0.0", "::", ""):
        return "*"
    return f"[{host}]" if ":" in host else host
