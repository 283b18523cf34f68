"""The streamed joint differentiates the forward graph again, so each op's derivative must be
eager's, also where its inputs saturate it.

A decomposition can be the same function with another derivative in floating point: SiLU written
as x / (1 + exp(-x)) has the derivative exp(-x) / (1 + exp(-x))^2, inf / inf at x = -100, where
autograd's ``silu_backward`` gives 0. Every elementwise function the decomposition table writes
with other ops stays whole in the joint (``backend.KEPT_WHOLE``), as does binary cross-entropy's
elementwise op, and the re-derived joint decomposes each with its own backward, as AOTAutograd
does. Here a tiny Llama's first MLP input goes through each function at a scale that saturates
it (the SwiGLU gate itself saturates too): gradients finite and equal to eager's, every region
streamed.
"""
import pytest
import torch
import torch.nn.functional as F

import zoo
from conftest import assert_grads_match, run_eager_and_compiled
from tiers import cases

FORMS = {
    "silu": lambda h: F.silu(h * 200),
    "gelu": lambda h: F.gelu(h * 200),
    "elu": lambda h: F.elu(h * 200),
    "selu": lambda h: F.selu(h * 200),
    "mish": lambda h: F.mish(h * 200),
    "softplus": lambda h: F.softplus(h * 200),
    "softplus_threshold": lambda h: F.softplus(h * 40, threshold=20),
    "logsigmoid": lambda h: F.logsigmoid(h * 200),
    "logaddexp": lambda h: torch.logaddexp(h * 200, -h * 200),
    "log_softmax": lambda h: h + torch.log_softmax(h * 200, -1),
    "expm1": lambda h: torch.expm1(F.relu(-h)),
    "bce_with_logits": lambda h: h + F.binary_cross_entropy_with_logits(h * 200, torch.ones_like(h), reduction="none"),
    "bce": lambda h: h + F.binary_cross_entropy(torch.sigmoid(h * 200), torch.full_like(h, 0.3), reduction="none"),
}
FAST = ("silu", "softplus", "bce")
# (the default run: one form of each way a decomposition overflows; the rest are extended)
DEFAULT = FAST + ("gelu", "softplus_threshold", "logsigmoid", "log_softmax", "bce_with_logits", "expm1")


@pytest.mark.parametrize("form", [pytest.param(*p.values, marks=[*p.marks, pytest.mark.fast]) if p.values[0] in FAST else p
                                  for p in cases(list(FORMS), DEFAULT, fast=FAST)])
def test_saturated_functions_get_eagers_finite_gradients(form):
    model, make_inputs = zoo.tiny_llama()
    mlp = model.layers[0].mlp
    inner, f = mlp.forward, FORMS[form]
    mlp.forward = lambda x: inner(f(x * 3))
    run = run_eager_and_compiled(model, make_inputs("prompt"), {"chunk_size": 5, "head_chunk_size": 5})
    assert all(torch.isfinite(g).all() for g in run.ref_grads.values() if g is not None)
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert sorted(run.schedules) == ["head", "layer.0", "layer.1"] and not run.warnings, (run.schedules, run.warnings)


class ProbabilityLoss(torch.nn.Module):
    """A loss of probabilities (binary cross-entropy of the sigmoid of each logit against one-hot
    targets), averaged over every element: probabilities of exactly 0 and 1 among them."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, labels):
        _, logits = self.lm(ids)
        target = F.one_hot(labels.clamp(min=0), logits.shape[-1]).float()
        return F.binary_cross_entropy(torch.sigmoid(logits * 100), target)


@pytest.mark.fast
def test_binary_cross_entropy_of_probabilities_streams_in_the_head():
    """Binary cross-entropy (mean reduction) as the loss: its elementwise op stays whole, the mean
    is a sum the head streams; exact where probabilities saturate to 0 and 1."""
    lm, make_inputs = zoo.tiny_llama()
    inputs = make_inputs("prompt")
    run = run_eager_and_compiled(ProbabilityLoss(lm), zoo.Inputs(inputs.args, {}, inputs.case, lambda o: o, None,
                                                                inputs.vocab), {"chunk_size": 5, "head_chunk_size": 5})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert run.schedules["head"] and not run.warnings, (run.schedules, run.warnings)


@pytest.mark.fast
def test_decompose_kept_replaces_each_kept_op_by_its_decomposition_in_place():
    """Before Inductor compiles a graph, each op kept whole is replaced by its decomposition
    (torch 2.11's Inductor has no lowering for some, SiLU and GELU among them): same values,
    placeholders and names kept."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from streamfx.decompose import KEPT_WHOLE, decompose_kept

    def f(x, y):
        return F.silu(x) * F.softplus(y, beta=2.0, threshold=5.0) + torch.clamp(x, min=0.0) + F.gelu(y)

    with FakeTensorMode():
        gm = make_fx(f)(torch.randn(3, 4), torch.randn(3, 4))
    names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
    assert sum(n.target in KEPT_WHOLE for n in gm.graph.nodes) == 4
    decompose_kept(gm)
    assert not any(n.target in KEPT_WHOLE for n in gm.graph.nodes)
    assert [n.name for n in gm.graph.find_nodes(op="placeholder")] == names
    x, y = torch.randn(3, 4) * 50, torch.randn(3, 4) * 50
    torch.testing.assert_close(gm(x, y), f(x, y))


@pytest.mark.fast
@pytest.mark.parametrize("state", ["frozen", "no_attention", "streamed"])
def test_inductor_compiles_the_graphs_with_kept_ops_decomposed(state):
    """Every graph Inductor compiles has the kept ops decomposed: an inference graph (a frozen
    model called with gradients on), a training graph where nothing streams (no attention: the
    joint as traced), and a streamed one. Outputs and gradients are eager's, nothing said."""
    import copy

    torch.manual_seed(0)
    if state == "no_attention":
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.SiLU(), torch.nn.GELU(), torch.nn.Linear(7, 3))
        args = (torch.randn(4, 5),)
        loss_of = lambda out: out.square().sum()   # noqa: E731
    else:
        model, make_inputs = zoo.tiny_llama()
        args, loss_of = make_inputs("prompt").args, (lambda out: out[0])
    if state == "frozen":
        model.requires_grad_(False)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="streambp", options={"codegen": "inductor", "chunk_size": 5})
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = loss_of(compiled(*args))
        if state != "frozen":
            loss.backward()
    assert not [str(w.message) for w in caught if "streamfx" in str(w.message)]
    ref_loss = loss_of(ref(*args))
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    if state != "frozen":
        ref_loss.backward()
        assert_grads_match({n: p.grad for n, p in ref.named_parameters()},
                           {n: p.grad for n, p in model.named_parameters()})
