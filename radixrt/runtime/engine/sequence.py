"""One scheduler request of an Engine call: its result so far (its deltas added up, its text
through an IncrementalDetokenizer) and its /generate-style output."""

from __future__ import annotations

from typing import Any

import msgspec

from radixrt.runtime.messages import TokenizedGenerateReq, TokenOut
from radixrt.runtime.request.incremental_detokenizer import IncrementalDetokenizer
from radixrt.runtime.request.sequence_result import SequenceResult, expand_beams, generate_output


class Sequence:
    """One scheduler request of a generate call: its result so far and its text stream."""

    def __init__(self, msg: TokenizedGenerateReq, tokenizer: Any, text_in_logprobs: bool = False):
        sp = msg.sampling_params
        self.msg = msg
        self.tokenizer = tokenizer
        # logprob entries carry the token's text (SGLang's option)
        self.text_in_logprobs = text_in_logprobs
        self.result = SequenceResult(msg.rid)
        self.text = IncrementalDetokenizer.for_request(tokenizer, sp)
        self.shown = ""  # text released to a stream so far

    def add(self, out: TokenOut) -> None:
        finished = out.finished_reason is not None
        if out.beams:
            IncrementalDetokenizer.add_beam_texts(
                self.tokenizer, self.msg.sampling_params, out.beams
            )
        text = self.text.feed(out.new_ids, finished=finished)
        self.result.add({**msgspec.structs.asdict(out), "text": text})

    @property
    def finished(self) -> bool:
        return self.result.finished

    def output(self, logprobs_from: int = 0) -> dict:
        return self.outputs(logprobs_from)[0]

    def outputs(self, logprobs_from: int = 0) -> list[dict]:
        """The sequence's result: one, or one per returned beam of a beam search."""
        token_text = (
            (lambda t: self.tokenizer.decode([t])) if self.text_in_logprobs else (lambda t: None)
        )
        return [
            generate_output(
                res, self.msg.options.return_logprob, token_text, logprobs_from=logprobs_from
            )
            for res in expand_beams(self.result)
        ]
