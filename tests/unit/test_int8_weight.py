"""int8 forms of a weight (model/int8_weight.py) and the per-row-count plan Linear reads them by
(model/linear.py), against independent truths: the dequantised values rebuilt by hand, x @ W^T in
float32 with bounds derived from the quantisation steps, and a counting stand-in for each kernel."""

import pytest
import torch

from radixrt.runtime.model import int8_weight, linear
from radixrt.runtime.model.int8_weight import Int8Weight
from radixrt.runtime.model.linear import (
    DENSE,
    INT4,
    INT8,
    INT8_DYN,
    MAX_ROWS,
    IntCopies,
    Linear,
    uniform_format,
)

pytestmark = pytest.mark.skipif(not int8_weight.available(), reason="no int8 CPU kernels")


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_per_channel_int8_is_within_half_a_step_of_every_value():
    w = torch.randn(48, 96, generator=gen(0)) * torch.linspace(0.01, 1.0, 48)[:, None]
    q = Int8Weight.from_float(w)
    step = w.abs().amax(dim=1) / 127  # each output channel's own grid
    assert q.qweight.dtype == torch.int8 and q.qweight.shape == w.shape
    assert bool(((q.dequantized() - w).abs() <= step[:, None] / 2 + 1e-7).all())
    assert int(q.qweight.abs().max()) == 127  # the grid spans the channel
    assert Int8Weight.from_float(torch.zeros(4, 8)).dequantized().abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_int8_matmuls_agree_with_the_float_product(dtype):
    w = torch.randn(64, 128, generator=gen(1)) * 0.05
    q = Int8Weight.from_float(w)
    x = torch.randn(5, 128, generator=gen(2)).to(dtype)
    exact = x.float() @ q.dequantized().t()
    wo = int8_weight.matmul_weight_only(x, q.qweight, q.scales)
    assert wo.dtype == dtype and wo.shape == (5, 64)
    torch.testing.assert_close(wo.float(), exact, atol=0.02 * float(exact.abs().max()), rtol=0.02)
    dyn = int8_weight.matmul_dynamic(x, q.qweight, q.scales).float()
    # activation rounding: at most half a row step per value, times |w| summed over K
    row_step = x.float().abs().amax(dim=1, keepdim=True) / 127
    bound = row_step / 2 * q.dequantized().abs().sum(dim=1)[None, :] + 0.01 * exact.abs()
    assert bool(((dyn - exact).abs() <= bound + 1e-4).all())


def test_linear_reads_each_row_range_in_its_plans_format(monkeypatch):
    w = torch.randn(32, 64, generator=gen(3)) * 0.1
    lin = Linear(w.bfloat16(), copies=IntCopies(None, Int8Weight.from_float(w)))
    assert lin.formats() == {DENSE, INT8, INT8_DYN}
    calls = []
    for name in ("matmul_weight_only", "matmul_dynamic"):
        real = getattr(int8_weight, name)
        monkeypatch.setattr(
            int8_weight, name, lambda x, *a, _n=name, _r=real: calls.append(_n) or _r(x, *a)
        )
    # int4 asked but not held: int8 stands in; dense beyond 8 rows
    lin.set_plan((1, INT4, 4, INT8_DYN, MAX_ROWS, DENSE))
    assert lin.plan == (1, INT8, 4, INT8_DYN, MAX_ROWS, DENSE)
    for rows in (1, 3, 9):
        x = torch.randn(rows, 64, generator=gen(rows)).bfloat16()
        torch.testing.assert_close(
            lin(x).float(), x.float() @ w.t(), atol=0.05 * float((x.float() @ w.t()).abs().max()),
            rtol=0.05,
        )  # fmt: skip
    assert calls == ["matmul_weight_only", "matmul_dynamic"]
    # a plan without dense drops the dense weight; one without int8 drops the int8 form
    lin.set_plan((MAX_ROWS, INT8_DYN))
    assert lin.weight is None and lin.formats() == {INT8, INT8_DYN}
    dense = Linear(w, copies=IntCopies(None, Int8Weight.from_float(w)))
    dense.set_plan(linear.DENSE_ONLY)
    assert dense.int8 is None and dense.formats() == {DENSE}


def test_a_bias_is_added_after_an_integer_matmul():
    w, b = torch.randn(16, 32, generator=gen(4)), torch.randn(16, generator=gen(5))
    lin = Linear(w, bias=b, copies=IntCopies(None, Int8Weight.from_float(w)))
    lin.set_plan((MAX_ROWS, INT8))
    x = torch.randn(2, 32, generator=gen(6))
    torch.testing.assert_close(lin(x), x @ w.t() + b, atol=0.05, rtol=0.02)


def test_uniform_format_of_a_bucket():
    plan = (1, INT4, 32, INT8_DYN, 1 << 20, INT8_DYN)
    assert uniform_format(plan, 1, 1) == INT4
    assert uniform_format(plan, 2, 32) == INT8_DYN
    assert uniform_format(plan, 33, 1 << 20) == INT8_DYN
    assert uniform_format(plan, 1, 4) is None  # changes inside
