"""Sliding-window attention in the torch backend against reference_attention with the same window (a loop over
requests applying transformers' rule, key j visible to query i when i - window < j <= i). Batches mix decodes
(some longer than the window, some shorter), drafts, fresh prompts, chunks after a cached prefix and requests
sharing a prefix (which the full-attention plan would run as a cascade); model-level agreement with
transformers is in test_llama_tiny.py (Mistral and Qwen2's hybrid layers)."""

from __future__ import annotations

import pytest
import torch
from attention_cases import check_against_reference, make_case

from radixrt.kernels.attention_torch import TorchAttentionBackend

CASES = {
    "decodes": ([3, 20, 41], [1, 1, 1]),
    "decodes_and_extends": ([9, 30, 0, 12], [1, 1, 25, 40]),
    "short_extends_join_decodes": ([16, 25], [3, 4]),
    "shared_prefix": ([48, 48, 48], [1, 1, 1]),
}


@pytest.mark.parametrize("window", [1, 4, 16, 64])
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_window_matches_reference(name, window, dtype):
    prefix_lens, extend_lens = CASES[name]
    case = make_case(
        prefix_lens,
        extend_lens,
        6,
        2,
        32,
        4,
        dtype,
        seed=window,
        share_prefix=name == "shared_prefix",
    )
    backend = TorchAttentionBackend(6, 2, 32, min_shared_len=8, min_saved_kv=0)
    tol = (1e-5, 1e-5) if dtype == torch.float32 else (2e-2, 2e-2)
    check_against_reference(backend, case, *tol, window=window)


def test_full_and_window_layers_share_one_forward():
    """A hybrid model runs both kinds of layer on one batch: the windowed plan is made once, beside the full one."""
    fb, q, k, v, k_cache, v_cache = make_case([30, 0], [1, 20], 4, 2, 32, 1, torch.float32, seed=9)
    backend = TorchAttentionBackend(4, 2, 32)
    backend.init_forward_metadata(fb)
    full = backend.forward(q, k, v, k_cache, v_cache, fb, 0.2)
    windowed = backend.forward(q, k, v, k_cache, v_cache, fb, 0.2, window=5)
    assert fb.window_meta is not None and fb.window_meta is not fb.attn_meta
    assert not torch.allclose(full, windowed), (
        "a window shorter than the context must change the output"
    )
    again = backend.forward(q, k, v, k_cache, v_cache, fb, 0.2)
    torch.testing.assert_close(again, full)
