"""The thinking of a reasoning model, separated from its answer (`--reasoning-parser`, SGLang's flag
and names): `message.reasoning_content` / `delta.reasoning_content` get the text inside
`<think>...</think>`, `content` the answer after it.

Formats (SGLang's names):
- `deepseek-r1`: the chat template opens the thinking, so the output starts inside it (a leading
  `<think>` the model writes anyway, as R1-0528 does, is dropped); everything up to `</think>` is
  reasoning, and an output that never closes it is all reasoning.
- `qwen3`: thinking only when the output opens with `<think>` (Qwen3 with `enable_thinking`, the
  template's default); an output that does not is all content (`enable_thinking: false`).
- `qwen3-thinking`: Qwen3-Thinking-2507, whose template opens the thinking: as `deepseek-r1`.

The incremental parser gives the same two strings whatever the split of the text it is fed
(streamed deltas or the whole output at once): text is held back only while it may still be part
of a tag, or while it is whitespace that would be trimmed (the reasoning's trailing whitespace, the
answer's leading whitespace, as SGLang strips them).
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_START = "<think>"
THINK_END = "</think>"


@dataclass(frozen=True)
class ReasoningFormat:
    name: str
    start: str
    end: str
    starts_inside: bool  # the template opens the thinking: output begins as reasoning


FORMATS = {
    "deepseek-r1": ReasoningFormat("deepseek-r1", THINK_START, THINK_END, starts_inside=True),
    "qwen3": ReasoningFormat("qwen3", THINK_START, THINK_END, starts_inside=False),
    "qwen3-thinking": ReasoningFormat("qwen3-thinking", THINK_START, THINK_END, True),
}
NAMES = tuple(FORMATS)


def reasoning_format(name: str) -> ReasoningFormat:
    fmt = FORMATS.get(name)
    if fmt is None:
        raise ValueError(f"unknown reasoning parser {name!r}; expected one of {', '.join(NAMES)}")
    return fmt


def thinks(fmt: ReasoningFormat, chat_template_kwargs: dict | None) -> bool:
    """Whether this request's output starts with thinking: always for a template that opens it;
    for qwen3 unless the request turned it off (`enable_thinking: false`, the template's switch)."""
    if fmt.starts_inside:
        return True
    return (chat_template_kwargs or {}).get("enable_thinking", True) is not False


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


_OPENING, _REASONING, _CONTENT = "opening", "reasoning", "content"


class ReasoningParser:
    """Feed output text in any pieces; each feed returns (reasoning delta, content delta)."""

    def __init__(self, fmt: ReasoningFormat):
        self.fmt = fmt
        self.buf = ""
        # inside: the output starts as reasoning, and may still open with the start tag
        self.state = _OPENING
        self.reasoning_started = False  # the leading whitespace of the reasoning is dropped
        self.content_started = False  # likewise the answer's

    @property
    def in_reasoning(self) -> bool:
        """The thinking has not ended (or, for qwen3, may still open)."""
        return self.state != _CONTENT

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        reasoning, content = "", ""
        if self.state == _OPENING:
            self._open()
        if self.state == _REASONING:
            reasoning = self._reasoning_step()
        if self.state == _CONTENT:
            content = self._content_step()
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """End of output: held-back text goes where it belongs (trimmed whitespace stays out)."""
        if self.state == _OPENING:
            # too short to decide: an unfinished start tag of a qwen3 output is content
            self.state = _REASONING if self.fmt.starts_inside else _CONTENT
        if self.state == _REASONING:
            rest = self.buf.rstrip()
            if not self.reasoning_started:
                rest = rest.lstrip()
            self.buf = ""
            return rest, ""
        content = self._content_step()
        return "", content

    def _open(self) -> None:
        head = self.buf.lstrip()
        if head.startswith(self.fmt.start):
            self.buf = head[len(self.fmt.start) :]
            self.state = _REASONING
        elif self.fmt.start.startswith(head):
            return  # still undecided (empty, whitespace or part of the tag)
        else:
            self.state = _REASONING if self.fmt.starts_inside else _CONTENT

    def _reasoning_step(self) -> str:
        at = self.buf.find(self.fmt.end)
        if at >= 0:
            text, self.buf = self.buf[:at].rstrip(), self.buf[at + len(self.fmt.end) :]
            self.state = _CONTENT
        else:
            keep = _partial_suffix(self.buf, self.fmt.end)
            text = self.buf[: len(self.buf) - keep]
            safe = len(text.rstrip())  # trailing whitespace waits: it is trimmed at the tag
            text, self.buf = text[:safe], self.buf[safe:]
        if not self.reasoning_started:
            text = text.lstrip()
            self.reasoning_started = bool(text)
        return text

    def _content_step(self) -> str:
        text, self.buf = self.buf, ""
        if not self.content_started:
            text = text.lstrip()
            self.content_started = bool(text)
        return text


def separate(fmt: ReasoningFormat, text: str) -> tuple[str, str]:
    """A whole output -> (reasoning, content), through the same parser."""
    parser = ReasoningParser(fmt)
    r1, c1 = parser.feed(text)
    r2, c2 = parser.finish()
    return r1 + r2, c1 + c2


def reasoning_token_count(output_ids: list[int], end_ids: list[int], still_thinking: bool) -> int:
    """Output tokens spent thinking: up to and including the end tag's tokens where they occur in
    the output; all of them when the thinking never ended; 0 when there was none."""
    n = len(end_ids)
    if n:
        for i in range(len(output_ids) - n + 1):
            if output_ids[i : i + n] == end_ids:
                return i + n
    return len(output_ids) if still_thinking else 0
