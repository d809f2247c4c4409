"""A chat request's thinking under `--reasoning-parser` (reasoning_parser.py): whether its output
starts by thinking, the end tag's ids that hold its grammar back until the answer
(RequestOptions.reasoning_end_ids), and per choice the split of the text into `reasoning_content`
and `content`, whole or as stream deltas, and `reasoning_tokens` for the usage.

`separate_reasoning: false` (SGLang's field) leaves the thinking in `content`; the grammar still
waits for the answer. `stream_reasoning: false` sends the thinking as one delta once it ends.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from radixrt.runtime.request.sequence_result import SequenceResult
from radixrt.runtime.serving.openai_api.reasoning_parser import (
    ReasoningParser,
    reasoning_format,
    reasoning_token_count,
    thinks,
)


@dataclass(frozen=True)
class Reasoning:
    """A piece of the thinking, among a tool parser's events (openai_chat_tools.py)."""

    text: str


class ChatReasoning:
    """One request's thinking, per choice; `enabled` False when the server has no parser or the
    request does not think (qwen3 with enable_thinking false).

    constrained: the request has a grammar. Under a format whose model opens its thinking itself
    (qwen3), the grammar must know where the thinking starts: the start tag and a newline, what the
    model writes first when it thinks, go at the end of the prompt instead (`prompt_suffix`), as
    the thinking models' templates put them, and the output starts inside the thinking."""

    def __init__(self, tm: Any, req: Any, constrained: bool = False):
        name = tm.config.reasoning_parser
        self.fmt = reasoning_format(name) if name else None
        self.enabled = self.fmt is not None and thinks(self.fmt, req.chat_template_kwargs)
        self.prompt_suffix = ""
        if self.enabled and constrained and not self.fmt.starts_inside:
            self.prompt_suffix = self.fmt.start + "\n"
            self.fmt = dataclasses.replace(self.fmt, starts_inside=True)
        self.separate = self.enabled and getattr(req, "separate_reasoning", True)
        self.stream_reasoning = getattr(req, "stream_reasoning", True)
        self.end_ids: tuple[int, ...] | None = None
        if self.enabled:
            ids = tm.tokenizer.encode(self.fmt.end, add_special_tokens=False)
            self.end_ids = tuple(int(t) for t in ids)
        self.parsers: dict[int, ReasoningParser] = {}  # per choice, made at its first text
        self.held: dict[int, str] = {}  # thinking not streamed yet (stream_reasoning false)
        self.reasoning: dict[int, str] = {}  # the whole thinking so far, per choice

    def feed(self, idx: int, text: str, finished: bool) -> tuple[str, str]:
        """(reasoning delta, content delta) of choice idx; without separation, all content."""
        if not self.separate:
            return "", text
        parser = self.parser(idx)
        reasoning, content = parser.feed(text)
        if finished:
            more_r, more_c = parser.finish()
            reasoning, content = reasoning + more_r, content + more_c
        self.reasoning[idx] = self.reasoning.get(idx, "") + reasoning
        if self.stream_reasoning:
            return reasoning, content
        self.held[idx] = self.held.get(idx, "") + reasoning
        if parser.in_reasoning and not finished:
            return "", content
        out, self.held[idx] = self.held[idx], ""
        return out, content

    def parser(self, idx: int) -> ReasoningParser:
        if idx not in self.parsers:
            self.parsers[idx] = ReasoningParser(self.fmt)
        return self.parsers[idx]

    def in_reasoning(self, idx: int) -> bool:
        """Choice idx may still be thinking (what it wrote so far has not closed the thinking)."""
        return self.enabled and self.parser(idx).in_reasoning

    def delta(self, idx: int, text: str, finished: bool) -> dict[str, Any]:
        """A stream chunk's delta fields for this text."""
        reasoning, content = self.feed(idx, text, finished)
        out: dict[str, Any] = {}
        if reasoning:
            out["reasoning_content"] = reasoning
        if content:
            out["content"] = content
        return out

    def message(self, text: str) -> dict[str, Any]:
        """A whole answer's message fields: content, and reasoning_content when separated."""
        if not self.separate:
            return {"content": text}
        parser = ReasoningParser(self.fmt)
        r1, c1 = parser.feed(text)
        r2, c2 = parser.finish()
        return {"content": c1 + c2, "reasoning_content": (r1 + r2) or None}

    def split_events(self, idx: int, text: str, finished: bool, parser: Any) -> list[Any]:
        """Choice idx's text through the thinking first, its answer through a tool-call parser:
        [Reasoning] + the parser's events (finished: the parser's last ones too)."""
        reasoning, content = self.feed(idx, text, finished)
        events: list[Any] = [Reasoning(reasoning)] if reasoning else []
        events += parser.feed(content) if content else []
        return events + (parser.finish() if finished else [])

    def tokens_of(self, idx: int, output_ids: list[int]) -> int:
        """Choice idx's thinking tokens among output_ids (its whole output, every phase)."""
        if not self.enabled:
            return 0
        still = self.in_reasoning(idx)
        return reasoning_token_count(output_ids, list(self.end_ids or ()), still)

    def reasoning_tokens(self, results: list[SequenceResult]) -> int:
        """Output tokens the choices spent thinking (the end tag's tokens included)."""
        if not self.enabled:
            return 0
        total = 0
        for res in results:
            parser = ReasoningParser(self.fmt)
            parser.feed(res.text)
            parser.finish()
            still = parser.in_reasoning
            total += reasoning_token_count(res.output_ids, list(self.end_ids or ()), still)
        return total


def with_reasoning_usage(usage: dict[str, Any], reasoning_tokens: int) -> dict[str, Any]:
    """OpenAI's usage.completion_tokens_details.reasoning_tokens."""
    return {**usage, "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}}


def has_grammar(req: Any, plan: Any) -> bool:
    """The chat request's answer is constrained: a constraint field, or tools it may call."""
    rf = req.response_format
    return (
        (rf is not None and rf.type != "text")
        or any(x is not None for x in (req.regex, req.json_schema, req.ebnf))
        or (plan is not None and plan.mode != "none")
    )
