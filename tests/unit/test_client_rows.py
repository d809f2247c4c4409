"""#56.5: a client's share of the in-flight slots counts rows, not requests: a beam search holds
beam_width running rows (each beam one), so it counts beam_width against --max-requests-per-client.
Truth: the real TokenizerManager.generate over a scheduler client stub that records what is sent."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from radixrt.runtime.config import ServerConfig
from radixrt.runtime.request.edge import expand_n
from radixrt.runtime.request.options import RequestOptions
from radixrt.runtime.request.sampling_params import SamplingParams
from radixrt.runtime.serving.http.metrics import ServerMetrics
from radixrt.runtime.serving.http.protocol import APIError
from radixrt.runtime.serving.http.tokenizer_manager import TokenizerManager

PER_CLIENT = 8


def manager() -> TokenizerManager:
    tm = TokenizerManager.__new__(TokenizerManager)  # only generate's path is used
    tm.config = ServerConfig(max_requests_per_client=PER_CLIENT)
    sent: list = []
    tm.scheduler = SimpleNamespace(
        check_alive=lambda: None,
        states={},
        metrics=ServerMetrics(),
        send_frames=sent.extend,
        config=tm.config,
        sent=sent,
    )
    return tm


def reqs(rid: str, client: str, **sampling):
    sp = SamplingParams(max_new_tokens=4, **sampling)
    sp.validate()
    return expand_n(rid, [5, 6, 7], sp, RequestOptions(client=client))


def test_beams_count_as_rows_against_the_clients_share():
    tm = manager()

    async def run():
        tm.generate(reqs("a1", "a", beam_width=4))
        tm.generate(reqs("a2", "a", beam_width=4))  # 8 rows: the share is full
        with pytest.raises(APIError) as e:
            tm.generate(reqs("a3", "a"))
        assert e.value.status == 429 and "8 sequences" in e.value.message
        tm.generate(reqs("b1", "b", n=4))  # another client is not held to a's share
        with pytest.raises(APIError) as e:  # one body asking for more than the share: a 400
            tm.generate(reqs("c1", "c", beam_width=PER_CLIENT + 1))
        assert e.value.status == 400

    asyncio.run(run())
    assert len(tm.scheduler.sent) == 2 + 4  # two beam searches and b's four copies
