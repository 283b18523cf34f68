"""Where eager autograd stops a gradient, so does the streamed graph.

AOTAutograd's joint graph keeps ``x.detach()`` as an alias and a ``torch.no_grad()`` block as
ordinary ops; streaming differentiates the forward graph again (and each chunk graph at run
time), so without explicit stops a gradient would flow where eager's never does: a policy-
gradient loss ``exp(logp - logp.detach())`` got gradients off by 168%, a recurrent model whose
early iterations run under ``no_grad`` (Hugging Face's HRM) by 100%. A ``torch.autograd.Function``
is one op with its own backward (``streamfx.passes.units``, tested in test_function_units.py);
one that cannot be (a size argument) is judged by ``stops.custom_backward``: a backward that is
not the derivative of its forward makes its graph run unstreamed, with a warning.
"""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import streamfx
import zoo
from conftest import assert_grads_match, run_eager_and_compiled
from streamfx.passes import stops


class PolicyGradient(torch.nn.Module):
    """The per-token ratio ``exp(logp - logp.detach())`` (1 in value; its gradient is
    ``d logp``), times an advantage, summed over the tokens: TRL's GRPO with one iteration."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, idx, labels, advantage):
        _, logits = self.lm(idx)
        logp = torch.log_softmax(logits.float(), -1).gather(-1, labels[..., None]).squeeze(-1)
        ratio = torch.exp(logp - logp.detach())
        return -(ratio * advantage[:, None] + 0.1 * logp).sum() / labels.numel()


def _policy_inputs(B=2, T=13, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, zoo.VOCAB, (B, T), generator=g)
    labels = torch.randint(1, zoo.VOCAB, (B, T), generator=g)
    args = (ids, labels, torch.randn(B, generator=g))
    return zoo.Inputs(args, {}, zoo.Case("t", B, T), lambda o: o, None, zoo.VOCAB)


def _exact_and_streamed(run, regions):
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert not run.warnings, run.warnings
    assert {p.name for p in run.programs} == regions, ([p.name for p in run.programs], run.warnings)


@pytest.mark.fast
def test_detach_in_the_loss_stops_the_gradient():
    """The detach is inside the streamed head: each chunk graph is differentiated with it."""
    lm, _ = zoo.tiny_llama()
    run = run_eager_and_compiled(PolicyGradient(lm), _policy_inputs(), {"chunk_size": 5, "head_chunk_size": 4})
    _exact_and_streamed(run, {"layer.0", "layer.1", "head"})


@pytest.mark.slow
def test_detach_in_the_loss_stops_the_gradient_inductor():
    lm, _ = zoo.tiny_llama()
    run = run_eager_and_compiled(PolicyGradient(lm), _policy_inputs(),
                                 {"chunk_size": 5, "head_chunk_size": 4, "codegen": "inductor"})
    _exact_and_streamed(run, {"layer.0", "layer.1", "head"})


class Recurrent(torch.nn.Module):
    """One decoder block applied ``steps`` times, the first ones under ``torch.no_grad()`` (the
    one-step gradient of HRM and other recurrent-depth models), then a head."""

    def __init__(self, steps=3, with_grad=1):
        super().__init__()
        torch.manual_seed(0)
        self.lm = zoo.TinyLlama(n_layer=1)
        self.steps, self.with_grad = steps, with_grad

    def forward(self, idx, labels):
        T = idx.shape[1]
        cos, sin = self.lm.cos[:T], self.lm.sin[:T]
        x = self.lm.embed(idx)
        z = torch.zeros_like(x)
        block = self.lm.layers[0]
        for i in range(self.steps):
            if i < self.steps - self.with_grad:
                with torch.no_grad():
                    z = block(z + x, cos, sin)
            else:
                z = block(z + x, cos, sin)
        logits = self.lm.lm_head(self.lm.norm(z))
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        return F.cross_entropy(logits.reshape(-1, self.lm.vocab), shifted.reshape(-1), ignore_index=-100)


@pytest.mark.fast
@pytest.mark.parametrize("codegen", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_no_grad_iterations_through_shared_weights(codegen):
    """The no-grad iterations use the same weights as the one with grad: only the last one
    contributes to their gradient. The value the no-grad block hands on is a gradient stop."""
    model = Recurrent()
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    inputs = zoo.Inputs(inputs.args, {}, inputs.case, lambda o: o, None, zoo.VOCAB)
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 4, "codegen": codegen})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert run.programs_named("head"), ([p.name for p in run.programs], run.warnings)


def test_hrm_recurrent_cycles_are_exact():
    """Hugging Face's HRM: an L stack iterated under ``no_grad`` then with grad, and an H stack,
    sharing the L stack's weights across iterations."""
    from transformers import HrmTextConfig, HrmTextForCausalLM

    torch.manual_seed(0)
    cfg = HrmTextConfig(vocab_size=zoo.VOCAB, hidden_size=zoo.HIDDEN, num_attention_heads=zoo.HEADS,
                        num_key_value_heads=zoo.HEADS, intermediate_size=64, num_layers_per_stack=1,
                        H_cycles=1, L_cycles=2, L_bp_cycles=[1], num_hidden_layers=3,
                        max_position_embeddings=zoo.MAX_POS, pad_token_id=zoo.PAD_ID, use_cache=False)
    cfg._attn_implementation = "sdpa"
    model = HrmTextForCausalLM(cfg).float().train()
    make_inputs = zoo._hf_inputs(zoo.VOCAB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the no-grad iteration shares a region with the next: warned, unstreamed
        run = run_eager_and_compiled(model, make_inputs(zoo.Case("t", 2, 12, pad="left")), {"chunk_size": 5})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert run.programs_named("head"), ([p.name for p in run.programs], run.warnings)


class BufferTables(torch.nn.Module):
    """Rotary tables computed from a buffer under ``torch.no_grad()`` (as Hugging Face's rotary
    embeddings did before transformers 5.24) and a detach of the input data, around a linear."""

    def __init__(self, d=8):
        super().__init__()
        self.proj = torch.nn.Linear(d, d)
        self.register_buffer("inv_freq", torch.rand(d // 2))

    def forward(self, x, position_ids):
        with torch.no_grad():
            freqs = position_ids[..., None].float() * self.inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
        y = self.proj(x) * emb.cos() + x.detach() * emb.sin()
        return y.sum()


@pytest.mark.fast
def test_no_grad_tables_of_buffers_get_no_stop():
    """A ``no_grad`` block that computes from buffers alone (rotary tables) and a detach of data
    are left as they are: nothing there would carry a gradient."""
    model = BufferTables()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append((copy.deepcopy(gm), stops.mark(gm)))
        return gm

    torch.compile(model, backend=capture)(torch.randn(2, 12, 8), torch.arange(12).expand(2, 12))
    (gm, count), = graphs
    assert count == 0
    toggles = [n for n in gm.graph.nodes if n.target is torch._C._set_grad_enabled]
    assert toggles, "the rotary tables' no_grad block is in the graph"


class ScaledGradient(torch.autograd.Function):
    """A backward that is not the derivative of the forward (x2 forward, x0.5 backward)."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 0.5


class WithFunction(torch.nn.Module):
    def __init__(self, lm, disabled=False):
        super().__init__()
        self.lm, self.disabled = lm, disabled

    def forward(self, idx, labels):
        loss, _ = self.lm(idx, labels)
        return _scale_outside(loss) if self.disabled else ScaledGradient.apply(loss)


@torch.compiler.disable
def _scale_outside(x):
    return ScaledGradient.apply(x)


def _lm_inputs():
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    return zoo.Inputs(inputs.args, {}, inputs.case, lambda o: o, None, zoo.VOCAB)


@pytest.mark.fast
def test_custom_autograd_function_on_the_loss_runs_as_a_unit():
    """A backward that is not the derivative (x2 forward, x0.5 backward) applied to the loss: the
    Function is one op with its own backward (``streamfx.passes.units``), so the gradients are
    eager's, and every region streams around it, also under strict."""
    lm, _ = zoo.tiny_llama()
    run = run_eager_and_compiled(WithFunction(lm), _lm_inputs(), {"chunk_size": 5, "head_chunk_size": 4,
                                                                 "strict": True})
    _exact_and_streamed(run, {"layer.0", "layer.1", "head"})


class ScaledBySize(torch.autograd.Function):
    """``ScaledGradient`` with a size argument it uses (symbolic in a dynamic compile)."""

    @staticmethod
    def forward(ctx, x, n):
        return x * (2 * n) / n

    @staticmethod
    def backward(ctx, g):
        return g * 0.5, None


class WithSizedFunction(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, idx, labels):
        loss, _ = self.lm(idx, labels)
        return ScaledBySize.apply(loss, idx.shape[1])


@pytest.mark.fast
@pytest.mark.heavy
def test_custom_autograd_function_with_a_size_argument_runs_unstreamed_and_says_where():
    """A symbolic size argument keeps the Function from being one op (a chunk would need its own
    size); its backward is not the derivative, so the graph runs unstreamed and exact, and the
    warning says why and what to do; strict raises."""
    lm, _ = zoo.tiny_llama()
    ref = copy.deepcopy(lm)
    inputs = _lm_inputs()
    ref_loss = WithSizedFunction(ref)(*inputs.args)
    ref_loss.backward()
    torch._dynamo.reset()
    model = WithSizedFunction(lm)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = torch.compile(model, backend="streambp", dynamic=True, options={"codegen": "eager"})(*inputs.args)
        loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match({k: p.grad for k, p in ref.named_parameters()}, {k: p.grad for k, p in lm.named_parameters()})
    text = [str(w.message) for w in caught if "streamfx" in str(w.message)]
    assert text and all("torch.autograd.Function" in t and "takes a size" in t and "test_gradient_stops.py" in t
                        and "torch.compiler.disable" in t for t in text), text
    torch._dynamo.reset()
    with pytest.raises(streamfx.StreamBPError, match="autograd.Function"):
        torch.compile(WithSizedFunction(zoo.tiny_llama()[0]), backend="streambp", dynamic=True,
                      options={"codegen": "eager", "strict": True})(*inputs.args)


class HandWrittenGelu(torch.autograd.Function):
    """A backward written by hand that is the derivative of the forward (Bloom's GeLU)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
        return g * (0.5 * x * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + t))


class GeluMLP(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return self.mlp.down(HandWrittenGelu.apply(self.mlp.gate(x)) * self.mlp.up(x))


@pytest.mark.fast
def test_custom_autograd_function_whose_backward_is_the_derivative_streams():
    """The Function's backward is checked against the derivative of its forward (numerically, at
    compile time, on random inputs of the call's shapes): where they agree, differentiating the
    forward is exact, and every layer streams."""
    lm, _ = zoo.tiny_llama()
    for block in lm.layers:
        block.mlp = GeluMLP(block.mlp)
    run = run_eager_and_compiled(lm, zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13)),
                                 {"chunk_size": 5, "head_chunk_size": 4})
    _exact_and_streamed(run, {"layer.0", "layer.1", "head"})


@pytest.mark.fast
def test_custom_autograd_function_outside_the_graph_lets_the_rest_stream():
    """The warning's remedy: the Function applied from a ``torch.compiler.disable``d function."""
    lm, _ = zoo.tiny_llama()
    run = run_eager_and_compiled(WithFunction(lm, disabled=True), _lm_inputs(), {"chunk_size": 5, "head_chunk_size": 4})
    _exact_and_streamed(run, {"layer.0", "layer.1", "head"})


class IgnoresSecondOutput(torch.autograd.Function):
    """Two outputs; the backward drops the second one's gradient (not the derivative)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin(), x * 3

    @staticmethod
    def backward(ctx, g1, g2):
        x, = ctx.saved_tensors
        return g1 * x.cos()


def _judged(fn, dtype):
    """``stops.custom_backward`` on Dynamo's graph of ``fn`` at an input of ``dtype``: the
    refused Function's node, or None."""
    found = []

    def capture(gm, example_inputs):
        found.append(stops.custom_backward(gm))
        return gm

    torch._dynamo.reset()
    x = torch.randn(4, 33, dtype=dtype, requires_grad=True)
    torch.compile(fn, backend=capture, fullgraph=True)(x)
    return found[0]


@pytest.mark.fast
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_derivative_check_follows_the_dtype(dtype):
    """A backward that is the derivative passes in every dtype (in bf16 the two differ by bf16's
    rounding, far above fp32's tolerance); one that is not is refused in every dtype, also when
    the output whose gradient it drops is the second one."""
    assert _judged(lambda x: HandWrittenGelu.apply(x * 2).sum(), dtype) is None
    assert _judged(lambda x: ScaledGradient.apply(x * 2).sum(), dtype) is not None
    assert _judged(lambda x: sum(t.sum() for t in IgnoresSecondOutput.apply(x)), dtype) is not None
    assert _judged(lambda x: IgnoresSecondOutput.apply(x)[0].sum(), dtype) is None  # second unread
