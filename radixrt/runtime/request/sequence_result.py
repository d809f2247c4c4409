"""A sequence's result as its deltas add up (SequenceResult), a beam search's beams as results of
their own (expand_beams), and SGLang's /generate result dict (generate_output). Re-exported by
request/edge.py; no torch, no HTTP framework here."""

from __future__ import annotations

from typing import Any, Callable


class SequenceResult:
    """Everything one sequence produced so far, accumulated from its deltas (dicts with the fields
    of TokenOut, plus "text" once detokenized)."""

    def __init__(self, rid: str = ""):
        self.rid = rid
        self.text = ""
        self.output_ids: list[int] = []
        self.finished_reason: dict[str, Any] | None = None
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0
        self.spec_verify_ct = self.spec_accepted_tokens = 0
        self.output_logprobs: list[list[Any]] = []
        self.output_top_logprobs: list[list[list[Any]]] = []
        self.input_logprobs: list[list[Any]] | None = None
        self.input_top_logprobs: list[list[list[Any]]] | None = None
        self.error: str | None = None
        self.error_status = 400
        self.server_error = False
        self.beams: list[dict[str, Any]] | None = None  # a finished beam search's (TokenOut.beams)
        self.beam_meta: dict[str, Any] | None = None  # one beam's (expand_beams)

    def add(self, out: dict[str, Any]) -> None:
        self.rid = out.get("rid", self.rid)
        self.text += out.get("text", "")
        self.output_ids.extend(out.get("new_ids", []))
        self.output_logprobs.extend(out.get("output_logprobs") or [])
        self.output_top_logprobs.extend(out.get("output_top_logprobs") or [])
        if out.get("input_logprobs") is not None:
            self.input_logprobs, self.input_top_logprobs = (
                out["input_logprobs"],
                out.get("input_top_logprobs"),
            )
        for key in (
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "spec_verify_ct",
            "spec_accepted_tokens",
        ):
            if out.get(key):
                setattr(self, key, out[key])
        if out.get("beams") is not None:
            self.beams = out["beams"]
        if out.get("finished_reason") is not None:
            self.finished_reason = out["finished_reason"]
            self.error = out.get("error")
            self.error_status = out.get("error_status") or 400
            self.server_error = bool(out.get("server_error"))

    @property
    def finished(self) -> bool:
        return self.finished_reason is not None


def expand_beams(res: SequenceResult) -> list[SequenceResult]:
    """A sequence's results as a client sees them: itself, or each beam of a finished beam search
    as a sequence of its own (text, ids, finish reason; its cumulative logprob and score)."""
    if res.beams is None:
        return [res]
    out = []
    for beam in res.beams:
        one = SequenceResult(res.rid)
        one.text, one.output_ids = beam.get("text", ""), list(beam["output_ids"])
        one.finished_reason = beam["finish_reason"]
        one.prompt_tokens, one.cached_tokens = res.prompt_tokens, res.cached_tokens
        one.completion_tokens = len(one.output_ids)
        one.beam_meta = {
            "cumulative_logprob": beam["cumulative_logprob"],
            "beam_score": beam["score"],
            "beam_peak_pages": beam["peak_pages"],
        }
        out.append(one)
    return out


def generate_output(
    res: SequenceResult,
    return_logprob: bool,
    token_text: Callable[[int], Any],
    index: int | None = None,
    logprobs_from: int = 0,
) -> dict[str, Any]:
    """SGLang's /generate (and Engine.generate) result: text, output_ids, meta_info, logprobs as
    (logprob, id, text or None) triples. logprobs_from: a stream chunk carries the output logprobs
    from there on (those it adds, as SGLang's streams do); output_token_logprobs_length and
    completion_tokens stay the totals so far."""
    meta: dict[str, Any] = {
        "id": res.rid,
        "prompt_tokens": res.prompt_tokens,
        "completion_tokens": res.completion_tokens,
        "cached_tokens": res.cached_tokens,
        "finish_reason": res.finished_reason,
    }
    if res.error:
        meta["error"] = res.error
    if res.spec_verify_ct:  # drafts were verified (SGLang's spec_verify_ct; the tokens kept)
        meta["spec_verify_ct"] = res.spec_verify_ct
        meta["spec_accepted_tokens"] = res.spec_accepted_tokens
    if res.beam_meta is not None:
        meta.update(res.beam_meta)
    if res.finished_reason and res.finished_reason.get("incomplete"):
        # a constrained output cut by its budget before the grammar completed
        meta["incomplete"] = True
    if return_logprob:

        def triple(x: list) -> tuple:
            return (x[0], x[1], token_text(x[1]))

        meta["input_token_logprobs"] = [triple(x) for x in res.input_logprobs or []]
        meta["input_top_logprobs"] = [
            [triple(x) for x in top] for top in res.input_top_logprobs or []
        ]
        meta["output_token_logprobs"] = [triple(x) for x in res.output_logprobs[logprobs_from:]]
        meta["output_top_logprobs"] = [
            [triple(x) for x in top] for top in res.output_top_logprobs[logprobs_from:]
        ]
        meta["output_token_logprobs_length"] = len(res.output_logprobs)
    out = {"text": res.text, "output_ids": list(res.output_ids), "meta_info": meta}
    if index is not None:
        out["index"] = index
    return out
