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


@pytest.mark.parametrize("form", [pytest.param(f, marks=pytest.mark.fast) if f in FAST else f for f in FORMS])
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
