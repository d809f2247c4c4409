"""A tokenizer's vocabulary as raw bytes, for outlines-core.

Each token id maps to the exact bytes it appends to the output: byte-level BPE tokens
(GPT-2, Llama-3, Qwen, SmolLM) go back through the GPT-2 byte<->unicode table; SentencePiece
tokens turn `▁` into a space and `<0xAB>` byte-fallback pieces into that byte. Special tokens
(BOS, EOS, chat markers, any added token flagged special) never appear inside constrained
text: they are left out, and EOS is handled by the grammar state (allowed when the FSM accepts).
"""

from __future__ import annotations

import functools
import re
from typing import Any

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@functools.cache
def unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to
    U+0100+."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + n)] = b
            n += 1
    return table


def _is_byte_level(tokenizer: Any) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.decoder is not None:
        return "ByteLevel" in repr(backend.decoder)
    vocab = tokenizer.get_vocab()
    return "Ġ" in "".join(list(vocab)[:5000]) or "Ċ" in "".join(list(vocab)[:5000])


def special_token_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


def token_bytes_map(tokenizer: Any, vocab_size: int) -> dict[bytes, list[int]]:
    """bytes -> token ids (several ids may spell the same bytes), special tokens excluded."""
    byte_level = _is_byte_level(tokenizer)
    u2b = unicode_to_byte()
    skip = special_token_ids(tokenizer)
    added = {
        int(i): t.content
        for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
    }
    out: dict[bytes, list[int]] = {}
    for text, idx in tokenizer.get_vocab().items():
        if idx in skip or idx >= vocab_size:
            continue
        if idx in added:  # added tokens are stored as plain text, not byte-level encoded
            raw = added[idx].encode("utf-8")
        elif byte_level:
            try:
                raw = bytes(u2b[ch] for ch in text)
            except KeyError:  # a char outside the byte table: not a byte-level piece we can spell
                continue
        else:
            m = _BYTE_FALLBACK.match(text)
            raw = bytes([int(m.group(1), 16)]) if m else text.replace("\u2581", " ").encode("utf-8")
        if raw:
            out.setdefault(raw, []).append(idx)
    for ids in out.values():
        ids.sort()
    return out
