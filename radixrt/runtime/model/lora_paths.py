"""Where a LoRA load at run time (POST /load_lora_adapter, Engine.load_lora_adapter) may read an
adapter: inside one of the --lora-dir roots the operator names, or one of the directories named by
--lora-paths at start. Paths are resolved (os.path.realpath: symlinks and `..`) before the check;
inside a root, the adapter's two files must resolve inside a root too (a symlinked file is checked
where it points). The operator's --lora-paths directories are trusted as a whole: they were read at
start, wherever their files point (a Hugging Face cache snapshot links into its blobs/).

Every refusal of a run-time load for its path or its files (outside the roots, missing, unreadable,
not a LoRA adapter, a rank, target or shape this model cannot serve) is one LoraRefused with one
text, REFUSED, so an answer tells a client nothing about the server's file system; the reason is
the exception's `detail`, for the server log.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
REFUSED = (
    "lora_path: no LoRA adapter this server may load is there (a directory under --lora-dir "
    "holding a PEFT adapter that fits the model; the server log says why not)"
)


class LoraRefused(ValueError):
    """A run-time load refused for its path or files: str() is REFUSED, `detail` is why."""

    def __init__(self, detail: str):
        super().__init__(REFUSED)
        self.detail = detail


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class LoraPaths:
    def __init__(self, roots: Sequence[str], named: Sequence[str]):
        for root in roots:
            if not os.path.isdir(root):
                raise ValueError(f"--lora-dir {root!r} is not a directory")
        self.roots = tuple(os.path.realpath(r) for r in roots)
        self.named = frozenset(os.path.realpath(p) for p in named)

    def check(self, path: object) -> str:
        """path resolved, if a run-time load may read it; LoraRefused (detail: why) if not."""
        if not isinstance(path, str) or not path or "\0" in path:
            raise LoraRefused(f"lora_path {path!r} is not a path")
        real = os.path.realpath(path)
        if real in self.named:
            return real
        if not any(_inside(real, root) for root in self.roots):
            where = ", ".join(self.roots) or "none given"
            raise LoraRefused(f"{path!r} resolves to {real!r}, outside every --lora-dir ({where})")
        for name in ADAPTER_FILES:
            file = os.path.realpath(os.path.join(real, name))
            if not any(_inside(file, root) for root in self.roots):
                raise LoraRefused(f"{name} in {real!r} resolves to {file!r}, outside --lora-dir")
        return real
