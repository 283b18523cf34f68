"""A custom op whose backward AOTAutograd cannot trace (it reads a tensor's values) is named as
the cause of an unstreamed graph, which runs eagerly and exactly (``streamfx.untraceable``)."""
import pytest
import torch
import torch.nn.functional as F

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


@torch.library.custom_op("streamfx_test::prefix_attention", mutates_args=())
def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention as a kernel streamfx has no rule for (as flex_attention, or an attention
    op of another package): [B, T, d] each."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@prefix_attention.register_fake
def _prefix_attention_fake(q, k, v):
    return torch.empty_like(q)


def _prefix_attention_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _prefix_attention_backward(ctx, grad):
    q, k, v = (x.detach().requires_grad_() for x in ctx.saved_tensors)
    with torch.enable_grad():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return torch.autograd.grad(out, (q, k, v), grad)


prefix_attention.register_autograd(_prefix_attention_backward, setup_context=_prefix_attention_setup)


class Layers(torch.nn.Module):
    """Decoder layers without embedding or loss (a graph piece between two graph breaks), their
    attention an op without a rule."""

    def __init__(self, d=16, n=2):
        super().__init__()
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d, 3 * d) for _ in range(n))
        self.out = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(n))

    def forward(self, h):
        for qkv, out in zip(self.qkv, self.out):
            h = h + out(prefix_attention(*qkv(h).chunk(3, dim=-1)))
        return h


@pytest.mark.fast
def test_layers_whose_attention_has_no_rule_are_not_silently_unstreamed():
    """A graph of layers alone (no token embedding, no per-token loss, no attention streamfx
    recognises: nothing to find the sequence by) whose gradient goes through an op without a rule
    says so, naming the op and its line, and runs exactly; strict raises."""
    torch.manual_seed(0)
    model, h = Layers(), torch.randn(2, 12, 16)
    ref = torch.autograd.grad(model(h).square().mean(), list(model.parameters()))
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match=r"no sequence found in this graph.*streamfx_test.prefix_attention at .*test_untraceable.py"):
        out = torch.compile(model, backend="streambp", options={"codegen": "eager"})(h)
    got = torch.autograd.grad(out.square().mean(), list(model.parameters()))
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b)
    torch._dynamo.reset()
    with pytest.raises(streamfx.StreamBPError, match=r"no sequence found in this graph"):
        torch.compile(model, backend="streambp", options={"codegen": "eager", "strict": True})(h)
