"""Jump-forward drafts: the text a grammar forces from a state, as tokens for the model to verify.

Forced text: when every token the index allows at a state (and the state is not final, so EOS
is no option) begins with the same byte b, the next byte of any valid output is b. We step the
index by b's one-byte token and repeat until the text may branch or end: after `{"` in a
closed object with one required key that is `name"`, after `"sunn` in an enum it is `y"`.

Draft: the forced text's canonical tokenization (the tokenizer's own encode), kept while each token
spells the next forced bytes and the index accepts it. The scheduler feeds the draft after the
request's last token in one forward; the sampler picks a token at every position under the mask of
the state the draft has reached there, and the draft is taken up to the first position whose pick
differs, plus that pick (speculative decoding with the grammar as the draft model). So the output is
the one decoding token by token would give: token for token under greedy, and in distribution under
sampling (a fixed draft token d is kept with probability p(d); otherwise the pick is a draw from p
restricted to tokens != d, which is exactly the residual of speculative sampling). A draft the model
disagrees with costs compute, never output. "Exactly" is as exact as the arithmetic: a draft
position's logits come from the extend path, not the decode path, so in bf16 on a GPU a near-tie can
fall the other way (as with the cache on vs off).
"""

from __future__ import annotations

from typing import Any

import numpy as np

MAX_DRAFT_BYTES = 96
MAX_DRAFT_TOKENS = 16


class VocabBytes:
    """Per-id spellings of the constrained vocabulary (special tokens left out)."""

    def __init__(self, token_map: dict[bytes, list[int]], num_ids: int):
        self.token_bytes: dict[int, bytes] = {i: b for b, ids in token_map.items() for i in ids}
        # one spare: an EOS id past the vocabulary
        self.first_byte = np.full(num_ids + 1, -1, dtype=np.int16)
        for i, b in self.token_bytes.items():
            self.first_byte[i] = b[0]
        spelled = self.first_byte[self.first_byte >= 0]
        # a state allowing more tokens than share any one first byte cannot force a byte
        self.max_same_first_byte = (
            int(np.bincount(spelled, minlength=256).max()) if len(spelled) else 0
        )
        # the one-byte token of each byte (byte-level BPE has all 256); -1 where none exists
        self.byte_token = [
            min(token_map[bytes([b])]) if bytes([b]) in token_map else -1 for b in range(256)
        ]


class Drafter:
    """Builds (and caches per compiled grammar and state) jump-forward drafts."""

    def __init__(self, tokenizer: Any, vocab: VocabBytes):
        self.tokenizer = tokenizer
        self.vocab = vocab

    def draft(self, compiled: Any, state: int) -> tuple[list[int], list[int]]:
        """(token ids, the index state after each) forced from `state`; ([], []) when nothing is."""
        cached = compiled.drafts.get(state)
        if cached is None:
            cached = compiled.drafts[state] = self._build(compiled, state)
        return cached

    def forced_bytes(self, compiled: Any, state: int) -> bytes:
        out = bytearray()
        while len(out) < MAX_DRAFT_BYTES:
            b = self._forced_byte(compiled, state)
            tok = self.vocab.byte_token[b] if b >= 0 else -1
            nxt = compiled.index.get_next_state(state, tok) if tok >= 0 else None
            if nxt is None:
                break
            out.append(b)
            state = nxt
        return bytes(out)

    def _forced_byte(self, compiled: Any, state: int) -> int:
        b = compiled.forced_byte.get(state)
        if b is None:
            b = -1
            if (
                not compiled.index.is_final_state(state)
                and compiled.facts(state)[1] <= self.vocab.max_same_first_byte
            ):
                allowed = np.asarray(compiled.index.get_allowed_tokens(state) or [], dtype=np.int64)
                firsts = self.vocab.first_byte[allowed[allowed < len(self.vocab.first_byte)]]
                if (
                    len(firsts) == len(allowed)
                    and len(firsts)
                    and firsts[0] >= 0
                    and (firsts == firsts[0]).all()
                ):
                    b = int(firsts[0])
            compiled.forced_byte[state] = b
        return b

    def _build(self, compiled: Any, state: int) -> tuple[list[int], list[int]]:
        forced = self.forced_bytes(compiled, state)
        text = _utf8_prefix(forced)
        if not text:
            return [], []
        ids, states, starts = [], [state], [0]
        for tok in self.tokenizer.encode(text, add_special_tokens=False)[:MAX_DRAFT_TOKENS]:
            spelled = self.vocab.token_bytes.get(tok)
            pos = starts[-1]
            if spelled is None or forced[pos : pos + len(spelled)] != spelled:
                break  # a tokenizer that normalises or prefixes text: keep what matched
            nxt = compiled.index.get_next_state(states[-1], tok)
            if nxt is None:
                break
            ids.append(tok)
            states.append(nxt)
            starts.append(pos + len(spelled))
        if (
            ids
            and starts[-1] == len(forced)
            and self._crosses_end(compiled, states[-2], forced[starts[-2] :])
        ):
            # the forced text ends where the output branches, and a longer token may span that end
            # (`"` then `":`): the model will mostly pick that one, so do not draft the last token
            ids.pop()
            states.pop()
        return ids, states[1:]

    def _crosses_end(self, compiled: Any, state: int, tail: bytes) -> bool:
        """Some token allowed at `state` spells `tail` and goes on past it."""
        for tok in compiled.index.get_allowed_tokens(state) or []:
            spelled = self.vocab.token_bytes.get(tok)
            if spelled is not None and len(spelled) > len(tail) and spelled.startswith(tail):
                return True
        return False


def _utf8_prefix(data: bytes) -> str:
    """The longest prefix of data that is whole UTF-8 characters (forced text may stop
    mid-character)."""
    for cut in range(len(data), max(len(data) - 4, 0) - 1, -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""
