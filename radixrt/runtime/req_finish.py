"""Applying a sampled token to a request and deciding whether it is finished.

Finish reasons are plain dicts (they cross processes): {"type": "stop", "matched": id or str},
{"type": "length", "length": n}, {"type": "abort", "message": str}.
"""
from __future__ import annotations

from radixrt.runtime.plan import ItemResult
from radixrt.runtime.req import Req

# Extra tokens decoded past the longest stop string: a token may carry part of a
# character (byte-level BPE), so a few more make sure the tail covers the whole string.
_STOP_TAIL_MARGIN = 4


def abort_reason(message: str) -> dict:
    return {"type": "abort", "message": message}


def apply_prompt_logprobs(req: Req, item_prefix_len: int, res: ItemResult) -> None:
    """Accumulate the prompt logprobs a step scored (the first prompt token has none)."""
    if req.input_logprobs is None and item_prefix_len <= max(req.logprob_start_len - 1, 0):
        req.input_logprobs, req.input_top_logprobs = [], []
        if req.logprob_start_len == 0:
            req.input_logprobs.append([None, req.origin_input_ids[0]])
            req.input_top_logprobs.append([])
    if res.prompt_logprobs:
        req.input_logprobs.extend(list(x) for x in res.prompt_logprobs)
        req.input_top_logprobs.extend(res.prompt_top_logprobs or [[] for _ in res.prompt_logprobs])


def apply_sampled_token(req: Req, res: ItemResult, eos_ids: set[int], tokenizer) -> dict | None:
    """Append the sampled token; return a finish reason or None."""
    sp = req.sampling
    tok = res.next_id
    req.output_ids.append(tok)
    if req.return_logprob:
        req.output_logprobs.append([res.logprob, tok])
        req.output_top_logprobs.append([list(x) for x in res.top_logprobs or []])
    if req.grammar is not None:
        try:
            req.grammar.accept(tok)
        except ValueError as e:
            return abort_reason(f"constraint violated: {e}")
        if req.grammar.is_terminated():
            return {"type": "stop", "matched": tok if tok in eos_ids else None}
    if tok in eos_ids and not sp.ignore_eos:
        return {"type": "stop", "matched": tok}
    if tok in sp.stop_token_ids:
        return {"type": "stop", "matched": tok}
    if sp.stop:
        matched = _match_stop_string(req, 1, tokenizer)
        if matched is not None:
            return {"type": "stop", "matched": matched}
    if len(req.output_ids) >= sp.max_new_tokens:
        return {"type": "length", "length": len(req.output_ids)}
    return None


def _match_stop_string(req: Req, num_new: int, tokenizer) -> str | None:
    longest = max(len(s) for s in req.sampling.stop)
    tail_ids = req.output_ids[-(num_new + longest + _STOP_TAIL_MARGIN):]
    tail = tokenizer.decode(tail_ids, skip_special_tokens=req.sampling.skip_special_tokens)
    # only stops that end within the newest tokens count; earlier ones were checked before
    new_text_len = len(tokenizer.decode(req.output_ids[-num_new:], skip_special_tokens=req.sampling.skip_special_tokens))
    window = tail[max(0, len(tail) - new_text_len - longest + 1):]
    first = None
    for s in req.sampling.stop:
        pos = window.find(s)
        if pos >= 0 and (first is None or pos < first[0]):
            first = (pos, s)
    return None if first is None else first[1]
