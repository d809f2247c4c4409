"""Incremental detokenization: token id deltas in, text deltas out (the detokenizer process).

Decoding one token at a time is wrong for byte-level BPE (a character may span tokens) and
slow to redo from the start, so each request keeps a short window: `decode(ids[prefix:])`
minus `decode(ids[prefix:read])` is the new text, and the window only moves once the new
text ends on a whole character. On top of that, text that could still become a stop string
is held back, so a stop string is never split across chunks and can be trimmed (OpenAI
semantics: the text ends right before the first stop string).
"""
from __future__ import annotations

import logging
from typing import Any

import zmq

from radixrt.runtime import messages
from radixrt.runtime.messages import (BatchTextOut, BatchTokenOut, DetokenizeReq, ProcessFailed, ProcessReady)

logger = logging.getLogger(__name__)

REPLACEMENT_CHAR = "\ufffd"  # what a decoder shows for an incomplete UTF-8 sequence


class IncrementalDetokenizer:
    """Text of one request, produced delta by delta. Pure logic: tokenizer in, strings out."""

    def __init__(self, tokenizer: Any, stop: list[str] | tuple[str, ...] = (), skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # decode window start (always on a character boundary)
        self.read_offset = 0  # ids before this are already in self.text
        self.pending_len = 0  # chars of the open window (ids[read_offset:]) already in self.text
        self.text = ""  # decoded text so far (may run past a stop string; trimmed on output)
        self.num_sent = 0  # chars of self.text already handed out
        self.matched_stop: str | None = None  # set once a stop string was found in the text

    @property
    def finished(self) -> bool:
        return self.matched_stop is not None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _absorb(self, flush: bool) -> None:
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])[len(prefix_text):]
        # A trailing replacement char means the last token ended mid-character: show what comes
        # before it, keep the window open for the rest (unless the request is over: then the broken
        # tail is what the model produced). The earlier tokens stay in the window as context
        # (sentencepiece decodes a word's leading space only after another token).
        if flush or not new_text.endswith(REPLACEMENT_CHAR):
            self.text += new_text[self.pending_len:]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.pending_len = 0
        else:
            stable = new_text.rstrip(REPLACEMENT_CHAR)
            if len(stable) > self.pending_len:
                self.text += stable[self.pending_len:]
                self.pending_len = len(stable)

    def _stop_hold_len(self) -> int:
        """Length of the longest unsent suffix of the text that is a proper prefix of a stop string."""
        unsent = len(self.text) - self.num_sent
        best = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, unsent), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def feed(self, new_ids: list[int], finished: bool = False) -> str:
        """Add the ids of one step; return the text that may be shown now.

        finished: the request is over, so everything held back is released (except text at or
        after a stop string). After a stop string is found the rest is always "".
        """
        if self.matched_stop is not None:
            return ""
        self.ids.extend(new_ids)
        self._absorb(flush=finished)
        if self.stop:
            # Earlier text never held a complete stop string (it would have been cut), and no unsent
            # text can start one before num_sent (a stop prefix is always held), so search from there.
            start = self.num_sent
            hits = [(self.text.find(s, start), -len(s), s) for s in self.stop]
            hits = [h for h in hits if h[0] >= 0]
            if hits:
                pos, _, s = min(hits)
                self.matched_stop = s
                out = self.text[self.num_sent:pos]
                self.text = self.text[:pos]
                self.num_sent = pos
                return out
        end = len(self.text) if finished else len(self.text) - self._stop_hold_len()
        out = self.text[self.num_sent:end]
        self.num_sent = end
        return out

    @property
    def sent_text(self) -> str:
        return self.text[:self.num_sent]


class DetokenizerManager:
    """Holds one IncrementalDetokenizer per live request and turns BatchTokenOut into BatchTextOut."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.states: dict[str, IncrementalDetokenizer] = {}
        self.done_early: set[str] = set()  # stop string seen here before the scheduler finished the request

    def register(self, req: DetokenizeReq) -> None:
        self.states[req.rid] = IncrementalDetokenizer(self.tokenizer, req.stop, req.skip_special_tokens)

    def handle(self, batch: BatchTokenOut) -> BatchTextOut:
        outputs = []
        for out in batch.outputs:
            rid = out["rid"]
            finished = out.get("finished_reason") is not None
            if rid in self.done_early:
                if finished:
                    self.done_early.discard(rid)
                continue
            state = self.states.get(rid)
            if state is None:  # never registered: only an immediate rejection or a late message can get here
                state = IncrementalDetokenizer(self.tokenizer)
            out = dict(out)
            out["text"] = state.feed(out["new_ids"], finished=finished)
            reason = out.get("finished_reason")
            if state.finished and (reason is None or reason.get("type") != "abort"):
                # The text was cut at a stop string: report that stop whatever the scheduler saw.
                out["finished_reason"] = {"type": "stop", "matched": state.matched_stop}
                if not finished:  # the scheduler will finish it on its own; drop what follows
                    self.done_early.add(rid)
            if out.get("finished_reason") is not None:
                self.states.pop(rid, None)
            outputs.append(out)
        return BatchTextOut(outputs=outputs)


def run_detokenizer_process(model_path: str, in_path: str, out_path: str, log_level: str = "info") -> None:
    """Entry point of the detokenizer process (spawned): PULL token deltas, PUSH text deltas."""
    from radixrt.runtime.launch import StopFlag, set_parent_death_signal

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
            from radixrt.runtime.weights import load_tokenizer
            manager = DetokenizerManager(load_tokenizer(model_path))
        except Exception as e:  # report and exit: the parent turns it into a start-up error
            logger.exception("detokenizer failed to start")
            push.send(messages.encode(ProcessFailed(name="detokenizer", error=f"{type(e).__name__}: {e}")))
            raise SystemExit(1)
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
    flag.exit_now()
