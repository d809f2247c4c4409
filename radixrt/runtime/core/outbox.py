"""What the scheduler sends back: each request's new tokens (and logprobs) since its last delta. The
message boundary: a request's FinishReason becomes SGLang's dict here."""

from __future__ import annotations

from radixrt.runtime.core.req import Req
from radixrt.runtime.messages import TokenOut


class Outbox:
    def __init__(self) -> None:
        self._outs: list[TokenOut] = []

    def emit(self, req: Req) -> None:
        """Queue req's delta: the output ids not yet sent, its finish reason and error if it
        ended."""
        new_ids = req.output_ids[req.num_sent :]
        first = req.num_sent
        req.num_sent = len(req.output_ids)
        out = TokenOut(
            rid=req.rid,
            new_ids=new_ids,
            finished_reason=None if req.finished_reason is None else req.finished_reason.to_dict(),
            prompt_tokens=len(req.origin_input_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            spec_verify_ct=req.spec_verify_ct,
            spec_accepted_tokens=req.spec_accepted,
            error=req.error,
            error_status=req.error_status,
        )
        if req.options.return_logprob:
            out.output_logprobs = req.output_logprobs[first:]
            out.output_top_logprobs = req.output_top_logprobs[first:]
            if not req.input_logprobs_sent and req.input_logprobs is not None:
                out.input_logprobs, out.input_top_logprobs = (
                    req.input_logprobs,
                    req.input_top_logprobs,
                )
                req.input_logprobs_sent = True
        self._outs.append(out)

    def put(self, out: TokenOut) -> None:
        """Queue a TokenOut built elsewhere (a finished beam search's)."""
        self._outs.append(out)

    def drain(self) -> list[TokenOut]:
        out, self._outs = self._outs, []
        return out
