"""Incremental detokenization of one request: token id deltas in, text deltas out.

Decoding one token at a time is wrong for byte-level BPE (a character may span tokens) and
slow to redo from the start, so each request keeps a short window: `decode(ids[prefix:])`
minus `decode(ids[prefix:read])` is the new text, and the window only moves once the new
text ends on a whole character. On top of that, text that could still become a stop string
is held back, so a stop string is never split across chunks and can be trimmed (OpenAI
semantics: the text ends right before the first stop string; SGLang's no_stop_trim keeps it).
stop_regex patterns (stop_regex.py) are searched over the text as it grows; as in SGLang, the
text that matched stays in the output, so nothing is held back for them.

This is the one place that decides a stop-string finish: the scheduler feeds it every sampled
token (and finishes the request when `finished` turns true); the detokenizer process and the
Engine run the same class over the same ids to produce the text, so they cut at the same place.
The cost of a step does not depend on the output length (a short decode window, and the stop
search starts at the text not yet handed out).
"""

from __future__ import annotations

from typing import Any

from radixrt.runtime.request.stop_regex import StopRegexSearch

REPLACEMENT_CHAR = "\ufffd"  # what a decoder shows for an incomplete UTF-8 sequence


class IncrementalDetokenizer:
    """Text of one request, produced delta by delta. Pure logic: tokenizer in, strings out."""

    def __init__(
        self,
        tokenizer: Any,
        stop: list[str] | tuple[str, ...] = (),
        skip_special_tokens: bool = True,
        *,
        stop_regex: list[str] | tuple[str, ...] = (),
        no_stop_trim: bool = False,
        spaces_between_special_tokens: bool = True,
    ):
        self.tokenizer = tokenizer
        self.stop = [s for s in stop if s]
        self.skip_special_tokens = skip_special_tokens
        self.stop_regex = [StopRegexSearch(p) for p in stop_regex]
        self.regex_fed = 0  # chars of self.text already fed to the stop_regex searches
        self.no_stop_trim = no_stop_trim
        # passed only when off: True is every tokenizer's default, and some decode() signatures lack
        # it
        self.decode_kwargs = (
            {} if spaces_between_special_tokens else {"spaces_between_special_tokens": False}
        )
        self.ids: list[int] = []
        self.prefix_offset = 0  # decode window start (always on a character boundary)
        self.read_offset = 0  # ids before this are already in self.text
        self.pending_len = 0  # chars of the open window (ids[read_offset:]) already in self.text
        self.text = ""  # decoded text so far (may run past a stop string; trimmed on output)
        self.num_sent = 0  # chars of self.text already handed out
        self.matched_stop: str | None = None  # set once a stop string was found in the text

    @classmethod
    def for_request(cls, tokenizer: Any, sp: Any) -> "IncrementalDetokenizer":
        """The text of a request with sampling parameters sp (a SamplingParams or its dict)."""
        get = sp.get if isinstance(sp, dict) else (lambda k, d=None: getattr(sp, k, d))
        return cls(
            tokenizer,
            get("stop") or [],
            get("skip_special_tokens", True),
            stop_regex=get("stop_regex") or [],
            no_stop_trim=get("no_stop_trim", False),
            spaces_between_special_tokens=get("spaces_between_special_tokens", True),
        )

    @property
    def finished(self) -> bool:
        return self.matched_stop is not None

    @classmethod
    def add_beam_texts(cls, tokenizer: Any, sp: Any, beams: list[dict[str, Any]]) -> None:
        """A finished beam search's beams (TokenOut.beams) each get their "text", decoded as a
        request's output with sampling parameters sp would be."""
        for beam in beams:
            beam["text"] = cls.for_request(tokenizer, sp).feed(beam["output_ids"], finished=True)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=self.skip_special_tokens, **self.decode_kwargs
        )

    def _absorb(self, flush: bool) -> None:
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])[len(prefix_text) :]
        # A trailing replacement char means the last token ended mid-character: show what comes
        # before it, keep the window open for the rest (unless the request is over: then the broken
        # tail is what the model produced). The earlier tokens stay in the window as context
        # (sentencepiece decodes a word's leading space only after another token).
        if flush or not new_text.endswith(REPLACEMENT_CHAR):
            self.text += new_text[self.pending_len :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.pending_len = 0
        else:
            stable = new_text.rstrip(REPLACEMENT_CHAR)
            if len(stable) > self.pending_len:
                self.text += stable[self.pending_len :]
                self.pending_len = len(stable)

    def _stop_hold_len(self) -> int:
        """Length of the longest unsent suffix of the text that is a proper prefix of a stop
        string."""
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
            # text can start one before num_sent (a stop prefix is always held), so search from
            # there.
            start = self.num_sent
            hits = [(self.text.find(s, start), -len(s), s) for s in self.stop]
            hits = [h for h in hits if h[0] >= 0]
            if hits:
                pos, _, s = min(hits)
                self.matched_stop = s
                return self._cut(pos + len(s) if self.no_stop_trim else pos)
        if self.stop_regex:
            new_text, self.regex_fed = self.text[self.regex_fed :], len(self.text)
            for search in self.stop_regex:
                # the match stays: the text runs to the end of this step
                if search.feed(new_text) is not None:
                    self.matched_stop = search.pattern
                    return self._cut(len(self.text))
        end = len(self.text) if finished else len(self.text) - self._stop_hold_len()
        out = self.text[self.num_sent : end]
        self.num_sent = end
        return out

    def _cut(self, pos: int) -> str:
        """End the text at pos (a stop was found); return what was not handed out yet."""
        out = self.text[self.num_sent : pos]
        self.text = self.text[:pos]
        self.num_sent = pos
        return out

    @property
    def sent_text(self) -> str:
        return self.text[: self.num_sent]
