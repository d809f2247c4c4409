"""Role prefixes and suffixes derived from the model's own (Jinja) chat template.

`s += user("hi")` must produce exactly the text `tokenizer.apply_chat_template` would,
so the radix cache sees the same tokens as an OpenAI-style chat request. We render the
template on marker messages and cut the output at the markers:

    render([system S])              -> sys_prefix  S sys_suffix
    render([system S, user U])      -> ... user_prefix U user_suffix
    render([system S, user U, asst A]) -> ... asst_prefix A asst_suffix
    render([user U])                -> a default system block, if the template adds one

Only jinja2 is used (no transformers, no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

ROLES = ("system", "user", "assistant")
_MARK = {
    "system": "RADIXRTSYSTEMMARK",
    "user": "RADIXRTUSERMARK",
    "assistant": "RADIXRTASSISTANTMARK",
}


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    role_prefix_and_suffix: dict[str, tuple[str, str]]
    default_system_prompt: str | None = None
    stop_str: tuple[str, ...] = field(default=())

    def get_prefix_and_suffix(
        self, role: str, history: list[dict[str, Any]] | None = None
    ) -> tuple[str, str]:
        if role not in self.role_prefix_and_suffix:
            raise ValueError(
                f"role {role!r} is not supported by chat template {self.name!r} "
                f"(roles: {', '.join(self.role_prefix_and_suffix)})"
            )
        return self.role_prefix_and_suffix[role]

    def render(self, messages: list[dict[str, str]]) -> str:
        """Messages -> text, the way the interpreter would build it (for tests and tracing)."""
        out = ""
        if messages and messages[0]["role"] != "system" and self.default_system_prompt:
            out += self._wrap("system", self.default_system_prompt)
        return out + "".join(self._wrap(m["role"], m["content"]) for m in messages)

    def _wrap(self, role: str, content: str) -> str:
        prefix, suffix = self.get_prefix_and_suffix(role)
        return prefix + content + suffix


# Used when the tokenizer has no chat template (base models).
PLAIN = ChatTemplate(
    "plain",
    {"system": ("SYSTEM:", "\n"), "user": ("USER:", "\n"), "assistant": ("ASSISTANT:", "\n")},
)


def _environment() -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    # Same environment options transformers uses, so whitespace control matches.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _split(text: str, mark: str) -> tuple[str, str]:
    idx = text.find(mark)
    if idx < 0:
        raise ValueError(f"the chat template dropped the message content {mark}")
    return text[:idx], text[idx + len(mark) :]


def from_jinja(
    template: str, bos_token: str = "", eos_token: str = "", name: str = "model"
) -> ChatTemplate:
    """Derive role prefixes/suffixes from a Jinja chat template.

    `bos_token` should be "" when the tokenizer adds BOS itself when encoding text (so the
    BOS is not doubled). Raises ValueError when the template cannot be cut into roles.
    """
    env = _environment()
    compiled = env.from_string(template)

    def render(roles: list[str], add_generation_prompt: bool = False) -> str:
        messages = [{"role": r, "content": _MARK[r]} for r in roles]
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            tools=None,
        )

    spans: dict[str, tuple[str, str]] = {}
    try:
        sys_only = render(["system"])
        spans["system"] = _split(sys_only, _MARK["system"])
        history, base = ["system"], sys_only
    except Exception:
        # Some templates (e.g. Gemma) reject a system role: programs may not use one.
        history, base = [], ""
    for role in ("user", "assistant"):
        full = render(history + [role])
        if not full.startswith(base):
            raise ValueError(
                f"chat template output for {history + [role]} does not extend {history}"
            )
        spans[role] = _split(full[len(base) :], _MARK[role])
        history, base = history + [role], full

    default_system = None
    if "system" in spans:
        head, _ = _split(render(["user"]), _MARK["user"])
        user_prefix = spans["user"][0]
        sys_prefix, sys_suffix = spans["system"]
        block = head[: len(head) - len(user_prefix)] if head.endswith(user_prefix) else ""
        if block and block.startswith(sys_prefix) and block.endswith(sys_suffix):
            default_system = block[len(sys_prefix) : len(block) - len(sys_suffix)]

    # The assistant's end marker (e.g. "<|im_end|>"), so generation inside an assistant
    # turn stops there even on a model whose EOS id is a different token.
    end_marker = spans["assistant"][1].strip()
    stop_str = (end_marker,) if end_marker else ()
    return ChatTemplate(name, spans, default_system, stop_str)


def from_tokenizer_config(
    template: str | None, bos_token: str = "", eos_token: str = "", name: str = "model"
) -> ChatTemplate:
    """The template when there is one and it can be cut into roles, else PLAIN."""
    if not template or not isinstance(template, str):
        return PLAIN
    try:
        return from_jinja(template, bos_token, eos_token, name)
    except Exception:
        return PLAIN
