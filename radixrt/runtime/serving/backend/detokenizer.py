"""The detokenizer process: token id deltas in, text deltas out, one IncrementalDetokenizer per
request."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import zmq

from radixrt.runtime import messages
from radixrt.runtime.messages import (
    BatchTextOut,
    BatchTokenOut,
    DetokenizeReq,
    ProcessFailed,
    ProcessReady,
    TextOut,
    TokenOut,
)
from radixrt.runtime.request.incremental_detokenizer import IncrementalDetokenizer

logger = logging.getLogger(__name__)


class DetokenizerManager:
    """Holds one IncrementalDetokenizer per live request and turns BatchTokenOut into
    BatchTextOut."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.states: dict[str, IncrementalDetokenizer] = {}
        self.params: dict[str, dict[str, Any]] = {}  # each live request's text options
        # stop string seen here before the scheduler finished the request
        self.done_early: set[str] = set()

    def register(self, req: DetokenizeReq) -> None:
        self.states[req.rid] = IncrementalDetokenizer.for_request(
            self.tokenizer, req.sampling_params
        )
        self.params[req.rid] = req.sampling_params

    def handle(self, batch: BatchTokenOut) -> BatchTextOut:
        outputs: list[TextOut] = []
        for out in batch.outputs:
            try:
                self._handle_one(out, outputs)
            except Exception as e:
                # this request's text failed: it alone ends (and the scheduler stops it)
                logger.exception("detokenizing %s failed", out.rid)
                self.states.pop(out.rid, None)
                self.params.pop(out.rid, None)
                if out.finished_reason is None:
                    self.done_early.add(out.rid)
                message = f"internal error: detokenizing failed: {type(e).__name__}: {e}"
                fields = msgspec.structs.asdict(out)
                fields.update(new_ids=[], error=message, error_status=500)
                fields["finished_reason"] = {"type": "abort", "message": message}
                fields["abort_scheduler"] = out.finished_reason is None
                outputs.append(TextOut(**fields))
        return BatchTextOut(outputs=outputs)

    def _handle_one(self, out: TokenOut, outputs: list[TextOut]) -> None:
        rid = out.rid
        finished = out.finished_reason is not None
        if rid in self.done_early:
            if finished:
                self.done_early.discard(rid)
            return
        state = self.states.get(rid)
        # never registered: only an immediate rejection or a late message can get here
        if state is None:
            state = IncrementalDetokenizer(self.tokenizer)
        text = TextOut(
            **msgspec.structs.asdict(out), text=state.feed(out.new_ids, finished=finished)
        )
        if text.beams:
            IncrementalDetokenizer.add_beam_texts(
                self.tokenizer, self.params.get(rid, {}), text.beams
            )
        reason = text.finished_reason
        if state.finished and (reason is None or reason.get("type") != "abort"):
            # The text was cut at a stop string: report that stop whatever the scheduler saw.
            text.finished_reason = {"type": "stop", "matched": state.matched_stop}
            if not finished:  # the scheduler will finish it on its own; drop what follows
                self.done_early.add(rid)
        if text.finished_reason is not None:
            self.states.pop(rid, None)
            self.params.pop(rid, None)
        outputs.append(text)


def run_detokenizer_process(
    model_path: str, in_path: str, out_path: str, log_level: str = "info"
) -> None:
    """Entry point of the detokenizer process (spawned): PULL token deltas, PUSH text deltas."""
    from radixrt.runtime.processes import StopFlag, set_parent_death_signal

    set_parent_death_signal()
    flag = StopFlag()
    logging.basicConfig(level=log_level.upper(), format="[detokenizer] %(levelname)s %(message)s")
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(in_path)
    push = ctx.socket(zmq.PUSH)
    push.connect(out_path)
    try:
        try:
            from radixrt.runtime.model.weights import load_tokenizer

            manager = DetokenizerManager(load_tokenizer(model_path))
        except Exception as e:  # report and exit: the parent turns it into a start-up error
            logger.exception("detokenizer failed to start")
            push.send(
                messages.encode(ProcessFailed(name="detokenizer", error=f"{type(e).__name__}: {e}"))
            )
            raise SystemExit(1) from None
        push.send(messages.encode(ProcessReady(name="detokenizer")))
        flag.enter_loop()
        while not flag.should_stop():
            if not pull.poll(200):
                continue
            msg = messages.decode(pull.recv())
            if isinstance(msg, DetokenizeReq):
                manager.register(msg)
            elif isinstance(msg, BatchTokenOut):
                push.send(messages.encode(manager.handle(msg)))
            else:
                logger.warning("unexpected message %s", type(msg).__name__)
    finally:
        pull.close(linger=0)
        push.close(linger=500)
        ctx.term()
    logger.info("stopped")
    flag.exit_now()
