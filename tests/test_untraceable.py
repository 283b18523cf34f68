"""A custom op whose backward AOTAutograd cannot trace (it reads a tensor's values) is named as
the cause of an unstreamed graph, which runs eagerly and exactly (``streamfx.untraceable``)."""
import pytest
import torch

import streamfx
import zoo
from conftest import assert_grads_match, run_eager_and_compiled


@torch.library.custom_op("streamfx_test::grouped_rows", mutates_args=())
def grouped_rows(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` times the weight of their group (``offs``: the groups' ends), as transformers <
    5.24's ``grouped_mm_fallback``: a loop over ``offs.tolist()``, forward and backward."""
    out, start = x.new_zeros(x.shape[0], w.shape[2]), 0
    for i, end in enumerate(offs.tolist()):
        out[start:end] = x[start:end] @ w[i]
        start = end
    return out


@grouped_rows.register_fake
def _grouped_rows_fake(x, w, offs):
    return x.new_empty(x.shape[0], w.shape[2])


def _grouped_rows_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.offs = inputs[2]


def _grouped_rows_backward(ctx, grad):
    x, w = ctx.saved_tensors
    gx, gw, start = torch.zeros_like(x), torch.zeros_like(w), 0
    for i, end in enumerate(ctx.offs.tolist()):  # a value read from a tensor: not traceable
        gx[start:end] = grad[start:end] @ w[i].T
        gw[i] = x[start:end].T @ grad[start:end]
        start = end
    return gx, gw, None


grouped_rows.register_autograd(_grouped_rows_backward, setup_context=_grouped_rows_setup)


class GroupedRows(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(2, 8, 8) / 3)
        self.register_buffer("offs", torch.tensor([5, 12]))

    def forward(self, x):
        return grouped_rows(x.flatten(0, 1), self.w, self.offs).square().mean()


@pytest.mark.fast
def test_custom_op_with_an_untraceable_backward_is_named():
    """A custom op whose backward reads ``offs.tolist()`` (transformers < 5.24's MoE fallback) cannot
    be traced into any joint graph: the graph runs eagerly, exact, and the warning names the op and
    why, not a generic failure; strict raises it."""
    torch.manual_seed(0)
    model, x = GroupedRows(), torch.randn(1, 12, 8)
    ref = torch.autograd.grad(model(x), model.w)[0]
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match=r"backward of streamfx_test::grouped_rows reads a tensor's values"):
        loss = torch.compile(model, backend="streambp", options={"codegen": "eager"})(x)
    torch.testing.assert_close(torch.autograd.grad(loss, model.w)[0], ref)
    torch._dynamo.reset()
    with pytest.raises(streamfx.StreamBPError, match=r"grouped_rows reads a tensor's values"):
        torch.compile(model, backend="streambp", options={"codegen": "eager", "strict": True})(x)


@pytest.mark.fast
@pytest.mark.skipif(zoo.moe_streams(), reason="transformers >= 5.24: grouped_mm_fallback has a traceable backward")
def test_moe_on_transformers_before_5_24_names_grouped_mm_fallback():
    """transformers < 5.24: an fp32 Qwen3-MoE graph cannot be compiled (grouped_mm_fallback's
    backward reads offs.tolist()); it runs exactly, and the warning names the op and the remedy."""
    model, make_inputs = zoo.qwen3_moe()
    run = run_eager_and_compiled(model, make_inputs(zoo.Case("t", 2, 16)), {"chunk_size": 5})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert any("transformers::grouped_mm_fallback reads a tensor's values" in w and "transformers >= 5.24" in w
               for w in run.warnings), run.warnings
