"""The cache view (core/cache_view.py) made readable: text previews from token ids, the request
limits checked with errors that name the field, and the tree drawn as indented text for a
terminal."""

from __future__ import annotations

from typing import Any

from radixrt.runtime.core.cache_view import MAX_DEPTH_LIMIT, MAX_NODES_LIMIT

PREVIEW_CHARS = 60


def check_view_limits(max_depth: Any, max_nodes: Any) -> None:
    """ValueError naming the field when a limit is not an integer in range."""
    for name, value, limit in (
        ("max_depth", max_depth, MAX_DEPTH_LIMIT),
        ("max_nodes", max_nodes, MAX_NODES_LIMIT),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            raise ValueError(f"{name} must be an integer in [1, {limit}], got {value!r}")


def add_previews(view: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """Replace every node's preview_ids with `text`: the start of its edge, decoded (special tokens
    kept, so a chat template's markers show), cut to PREVIEW_CHARS characters."""
    stack = [view["root"]]
    while stack:
        node = stack.pop()
        ids = node.pop("preview_ids", [])
        text = tokenizer.decode(ids, skip_special_tokens=False) if ids else ""
        if len(text) > PREVIEW_CHARS or len(ids) < node["num_tokens"]:
            text = text[:PREVIEW_CHARS] + "…"
        node["text"] = text
        stack.extend(node["children"])
    return view


def render_text(view: dict[str, Any]) -> str:
    """The tree as indented lines: tokens, hits, tokens served, age, locks/pins, and the text
    preview."""
    lines = [
        f"radix cache: {view['num_nodes']} nodes, {view['num_tokens']} tokens "
        f"(showing {view['num_nodes_shown']}; page size {view['page_size']})"
        + (" — the radix cache is disabled" if view.get("disabled") else "")
    ]

    def walk(node: dict[str, Any], indent: str) -> None:
        children = node["children"]
        for i, child in enumerate(children):
            last = i == len(children) - 1 and not node.get("omitted")
            age = child.get("last_access_age_s")
            flags = "".join(
                [
                    f" locked×{child['lock_ref']}" if child["lock_ref"] else "",
                    f" pinned×{child['pins']}" if child["pins"] else "",
                    f" sessions {','.join(child['sessions'])}" if child.get("sessions") else "",
                ]
            )
            lines.append(
                f"{indent}{'└─' if last else '├─'} {child['num_tokens']} tok "
                f"· hits {child['hits']} · served {child['tokens_served']} "
                f"· {'-' if age is None else f'{age:.0f}s ago'}{flags}  {child['text']!r}"
            )
            walk(child, indent + ("   " if last else "│  "))
        if node.get("omitted"):
            o = node["omitted"]
            lines.append(
                f"{indent}└─ … {o['nodes']} more nodes, {o['tokens']} tok, hits {o['hits']}"
            )

    walk(view["root"], "")
    return "\n".join(lines)
