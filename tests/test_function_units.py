"""A ``torch.autograd.Function`` with a backward of its own streams as a unit.

Its forward and its own backward run per chunk (``streamfx.passes.units``), never differentiated
again: a straight-through estimator (a backward that is not the derivative of the forward) and a
fused RMSNorm written as a Function stream exactly; a Function that combines positions along
the sequence is refused with the op that does it, and its graph runs exactly unstreamed.
"""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import streamfx
import zoo
from conftest import assert_grads_match, grads_of, run_eager_and_compiled
from streamfx.chunks import COUNTERS


class StraightThrough(torch.autograd.Function):
    """Rounds to a grid of 1/4 in the forward; the backward passes the gradient through as if
    the rounding were the identity (a straight-through estimator: not the derivative, which is 0)."""

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, g):
        return g


class FusedRMSNorm(torch.autograd.Function):
    """RMSNorm with its backward written by hand, as fused kernels (Liger, Unsloth) wrap theirs:
    saves the input and the per-token inverse RMS, returns the input's and the weight's gradient
    (the weight's is a sum over every token)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return x * rstd * weight

    @staticmethod
    def backward(ctx, g):
        x, weight, rstd = ctx.saved_tensors
        xhat = x * rstd
        gw = g * weight
        dx = rstd * (gw - xhat * (gw * xhat).mean(-1, keepdim=True))
        dweight = (g * xhat).reshape(-1, x.shape[-1]).sum(0)
        return dx, dweight, None


class PrefixMean(torch.autograd.Function):
    """Each token's running mean over the tokens before it (a cumsum along the sequence)."""

    @staticmethod
    def forward(ctx, x):
        n = torch.arange(1, x.shape[1] + 1, dtype=x.dtype).view(1, -1, 1)
        ctx.save_for_backward(n)
        return x.cumsum(1) / n

    @staticmethod
    def backward(ctx, g):
        n, = ctx.saved_tensors
        return (g / n).flip(1).cumsum(1).flip(1)


class QuantizedMLP(torch.nn.Module):
    """The SwiGLU MLP with its input quantized by ``StraightThrough``."""

    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return self.mlp(StraightThrough.apply(x))


class FunctionNorm(torch.nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.eps

    def forward(self, x):
        return FusedRMSNorm.apply(x, self.weight, self.eps)


class PrefixMeanMLP(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return self.mlp(PrefixMean.apply(x))


def _llama(wrap):
    lm, make_inputs = zoo.tiny_llama()
    for block in lm.layers:
        wrap(block)
    return lm, make_inputs(zoo.Case("t", 2, 13))


def _exact(run):
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)


def _max_rel_error(run) -> float:
    return max(((run.grads[k] - g).abs().max() / g.abs().max().clamp_min(1e-30)).item()
               for k, g in run.ref_grads.items() if g is not None)


@pytest.mark.fast
@pytest.mark.heavy
def test_straight_through_estimator_streams_with_its_own_backward():
    """The estimator's backward (the identity) is not the derivative of its forward (zero almost
    everywhere): differentiating the forward again would zero every gradient below it. As a unit
    it runs per chunk with its own backward, and every layer streams."""
    lm, inputs = _llama(lambda block: setattr(block, "mlp", QuantizedMLP(block.mlp)))
    run = run_eager_and_compiled(lm, inputs, {"chunk_size": 5, "head_chunk_size": 4, "strict": True})
    _exact(run)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, run.warnings
    assert run.counters["chunks_backward"] >= 2 * 3, run.counters
    assert not run.warnings, run.warnings
    # the gradient below the estimator is not zero (the derivative of round would make it so)
    assert run.grads["layers.0.mlp.mlp.gate.weight"].abs().max() > 0
    assert run.counters["unit_backward"] == 2 * 3, run.counters  # its own backward, per chunk
    print(f"straight-through: max relative gradient error {_max_rel_error(run):.2e}")
    torch._dynamo.reset()
    lm2, inputs2 = _llama(lambda block: setattr(block, "mlp", QuantizedMLP(block.mlp)))
    report = streamfx.explain(lm2, *inputs2.args, options={"chunk_size": 5})
    assert sorted(where for _, where in report.units) == ["per chunk in layer.0", "per chunk in layer.1"], report.units
    assert all("StraightThrough" in what and "test_function_units.py" in what for what, _ in report.units), report.units
    assert "one op with its own backward" in str(report)


@pytest.mark.fast
@pytest.mark.parametrize("codegen", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_fused_rmsnorm_function_streams(codegen):
    """Every norm of the model is a Function with a hand-written backward: the layers and the
    head stream, the weights' gradients (sums over all tokens) accumulate over chunks."""
    def wrap(block):
        block.attn_norm, block.mlp_norm = FunctionNorm(block.attn_norm), FunctionNorm(block.mlp_norm)

    lm, inputs = _llama(wrap)
    lm.norm = FunctionNorm(lm.norm)
    run = run_eager_and_compiled(lm, inputs, {"chunk_size": 5, "head_chunk_size": 4, "strict": True,
                                              "codegen": codegen})
    _exact(run)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, run.warnings
    assert not run.warnings, run.warnings
    # its own backward ran per chunk: 2 norms x 3 chunks per layer (the attention's norm for the
    # queries and again for the keys and values), 4 chunks of the head's norm
    assert run.counters["unit_backward"] >= 2 * 2 * 3 + 4, run.counters
    print(f"fused RMSNorm ({codegen}): max relative gradient error {_max_rel_error(run):.2e}")


@pytest.mark.fast
@pytest.mark.heavy
def test_function_mixing_tokens_is_refused_and_exact():
    """A cumsum along the sequence in the Function: its layers are refused naming the Function,
    its op and the line that applies it; the graph runs exactly; strict raises."""
    lm, inputs = _llama(lambda block: setattr(block, "mlp", PrefixMeanMLP(block.mlp)))
    run = run_eager_and_compiled(lm, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    _exact(run)
    assert not {p.name for p in run.programs} & {"layer.0", "layer.1"}, [p.name for p in run.programs]
    text = " ".join(run.warnings)
    assert "PrefixMean" in text and "cumsum" in text and "test_function_units.py" in text, run.warnings
    torch._dynamo.reset()
    lm2, inputs2 = _llama(lambda block: setattr(block, "mlp", PrefixMeanMLP(block.mlp)))
    with pytest.raises(streamfx.StreamBPError, match="PrefixMean"):
        torch.compile(lm2, backend="streambp", options={"codegen": "eager", "strict": True})(*inputs2.args)


class Rotary(torch.autograd.Function):
    """Rotary embedding of the queries and the keys in one Function (as fused RoPE kernels
    are), its backward the inverse rotation written by hand."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        ctx.save_for_backward(cos, sin)

        def rotate(x):
            x1, x2 = x.chunk(2, -1)
            return x * cos + torch.cat((-x2, x1), -1) * sin
        return rotate(q), rotate(k)

    @staticmethod
    def backward(ctx, gq, gk):
        cos, sin = ctx.saved_tensors

        def back(g):
            g1, g2 = (g * sin).chunk(2, -1)
            return g * cos + torch.cat((g2, -g1), -1)
        return back(gq), back(gk), None, None


class RotaryAttention(zoo.LlamaAttention):
    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q, k = Rotary.apply(q, k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


@pytest.mark.fast
def test_rotary_function_on_queries_and_keys_streams():
    """One unit makes the queries and the keys: the keys' rows run through it per chunk in the
    K/V graph, the queries' in the query graph, each backward with the Function's own."""
    lm, inputs = _llama(lambda block: setattr(block.attn, "__class__", RotaryAttention))
    run = run_eager_and_compiled(lm, inputs, {"chunk_size": 5, "head_chunk_size": 4, "strict": True})
    _exact(run)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, run.warnings
    assert run.counters["unit_backward"] >= 2 * 3, run.counters
    print(f"rotary: max relative gradient error {_max_rel_error(run):.2e}")


class TokenCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy with its backward written by hand (``softmax - onehot``), as a
    fused loss kernel wraps it; labels -100 give 0."""

    @staticmethod
    def forward(ctx, logits, labels):
        lse = torch.logsumexp(logits, -1)
        picked = logits.gather(-1, labels.clamp_min(0)[:, None])[:, 0]
        ctx.save_for_backward(logits, labels, lse)
        return torch.where(labels != -100, lse - picked, 0.0)

    @staticmethod
    def backward(ctx, g):
        logits, labels, lse = ctx.saved_tensors
        p = torch.exp(logits - lse[:, None]) - F.one_hot(labels.clamp_min(0), logits.shape[-1]).to(logits.dtype)
        return p * (g * (labels != -100))[:, None], None


class FusedLoss(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, idx, labels):
        _, logits = self.lm(idx)
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        per_token = TokenCrossEntropy.apply(logits.reshape(-1, self.lm.vocab), shifted.reshape(-1))
        return per_token.sum() / (shifted != -100).sum()


@pytest.mark.fast
def test_fused_cross_entropy_function_streams_in_the_head():
    """The head streams through a loss Function of the flattened (batch x tokens) rows: its
    labels input is chunked with the logits (the unit lines the two up), its own backward runs
    per head chunk."""
    lm, make_inputs = zoo.tiny_llama()
    inputs = make_inputs(zoo.Case("t", 2, 13))
    inputs = zoo.Inputs(inputs.args, {}, inputs.case, lambda o: o, None, zoo.VOCAB)
    run = run_eager_and_compiled(FusedLoss(lm), inputs, {"chunk_size": 5, "head_chunk_size": 4, "strict": True})
    _exact(run)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, run.warnings
    assert run.counters["unit_backward"] == 4, run.counters
    print(f"fused cross-entropy: max relative gradient error {_max_rel_error(run):.2e}")


class LinearFunction(torch.autograd.Function):
    """``x @ weight.T`` with its backward written out, as DeepSpeed ZeRO-3 replaces
    ``F.linear`` (``LinearFunctionForZeroStage3``)."""

    @staticmethod
    def forward(ctx, x, weight):
        ctx.save_for_backward(x, weight)
        return x.matmul(weight.t())

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        return g.matmul(weight), g.reshape(-1, g.shape[-1]).t().matmul(x.reshape(-1, x.shape[-1]))


class FunctionLinear(torch.nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.weight = linear.weight

    def forward(self, x):
        return LinearFunction.apply(x, self.weight)


class BreakAfter(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        y = self.module(x)
        torch._dynamo.graph_break()  # what follows is a graph of its own (as ZeRO-3's hooks make it)
        return y


@pytest.mark.fast
def test_lm_head_as_a_function_streams_with_its_loss():
    """An LM head whose projection is a Function (ZeRO-3's linear), in a graph of its own with the
    loss (a graph break before it, as ZeRO-3's hooks make): the head region starts at the hidden
    state it receives and takes the unit in, so the logits stream (no "logits arrive as an input"
    caveat, which a graph with no projection before its loss gets)."""
    lm, inputs = _llama(lambda block: None)
    lm.lm_head, lm.norm = FunctionLinear(lm.lm_head), BreakAfter(lm.norm)
    run = run_eager_and_compiled(lm, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    _exact(run)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, run.warnings
    assert not run.warnings, run.warnings
    head = next(p for p in run.programs if p.name == "head")
    assert any(str(n.target) == "streamfx.unit.default" for n in head.full_gm.graph.nodes), head.full_gm.graph


def _noise(x):
    """Uniform-looking numbers in (0, 1) from each value of ``x`` (a hash of it), so the routing
    samples are the same in eager and in every chunk."""
    with torch.no_grad():
        return torch.frac(torch.sin(x.float() * 12.9898) * 43758.5453).clamp(1e-6, 1 - 1e-6).to(x.dtype)


def _sparsemixer(scores, jitter_eps, training, top_k=2):
    """transformers' Phi-MoE ``sparsemixer`` in training mode with its random draws (Gumbel
    sampling of the experts, the midpoint mask of Heun's method) replaced by ``_noise`` of the
    router scores: the same routes and the same straight-through ``PhimoeMultiplier``."""
    from transformers.models.phimoe.modeling_phimoe import PhimoeMultiplier

    def pick(scores, masked_scores, salt):
        with torch.no_grad():
            threshold, _ = masked_scores.max(dim=-1, keepdim=True)
            factor = scores.abs().clamp(min=threshold)
            hidden = ((threshold - scores) / factor) > (2 * jitter_eps)
        gates = masked_scores.masked_fill(hidden, float("-inf"))
        selected = (gates - (-torch.log(_noise(scores + salt))).log()).max(dim=-1)[1].unsqueeze(-1)
        gates = torch.softmax(gates, dim=-1)
        best, best_ind = gates.max(dim=-1, keepdim=True)
        one = torch.logical_or(selected == best_ind, _noise(best + salt) > 0.75)
        one = torch.add(0.3333, one, alpha=0.6667).type_as(gates)
        return PhimoeMultiplier.apply(scores, gates.gather(dim=-1, index=selected), selected, gates, one), selected

    first, selected = pick(scores, scores, 0.0)
    second, selected_2 = pick(scores, torch.scatter(scores, -1, selected, float("-inf")), 0.5)
    return torch.concat((first, second), dim=-1), torch.concat((selected, selected_2), dim=-1)


@pytest.mark.slow
@pytest.mark.skipif(not zoo.moe_streams(), reason="transformers < 5.24: grouped_mm_fallback's backward reads "
                    "offs.tolist(); tests/test_untraceable.py checks the refusal")
def test_phimoe_router_estimator_streams(monkeypatch):
    """Phi-MoE's router gradient is ``PhimoeMultiplier``'s straight-through estimate, a backward
    that is not the derivative of its forward: every layer streams, with eager's gradients."""
    from transformers import PhimoeConfig, PhimoeForCausalLM
    from transformers.models.phimoe import modeling_phimoe

    monkeypatch.setattr(modeling_phimoe, "sparsemixer", _sparsemixer)
    cfg = PhimoeConfig(vocab_size=zoo.VOCAB, hidden_size=zoo.HIDDEN, intermediate_size=16, num_hidden_layers=2,
                       num_attention_heads=zoo.HEADS, num_key_value_heads=zoo.KV_HEADS, num_local_experts=4,
                       num_experts_per_tok=2, max_position_embeddings=zoo.MAX_POS, pad_token_id=zoo.PAD_ID,
                       router_jitter_noise=0.01, input_jitter_noise=0.0)
    model = zoo._hf(PhimoeForCausalLM, cfg, "sdpa")
    inputs = zoo._hf_inputs(zoo.VOCAB)(zoo.Case("t", 2, 16))
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 6, "strict": True})
    _exact(run)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, run.warnings
    assert all(set(runs) == {4} for name, runs in run.schedules.items() if name.startswith("layer.")), run.schedules
    assert not run.warnings, run.warnings
    assert run.counters["unit_backward"] == 2 * 2 * 4, run.counters  # 2 estimators x 4 chunks per layer
    print(f"Phi-MoE: max relative gradient error {_max_rel_error(run):.2e}")


class RowScale(torch.autograd.Function):
    """Rows of features times a weight through a flattened view (sizes read from the input: a
    dynamic compile passes them to the Function as symbols)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return (x.reshape(-1, x.shape[-1]) * w).view(x.shape)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w, (g * x).reshape(-1, x.shape[-1]).sum(0)


class LengthScaled(torch.autograd.Function):
    """Scales each token by the sequence length: a length read as a number."""

    @staticmethod
    def forward(ctx, x):
        ctx.length = x.shape[1]
        return x * x.shape[1]

    @staticmethod
    def backward(ctx, g):
        return g * ctx.length


class ScaledMLP(torch.nn.Module):
    def __init__(self, mlp, d, by_length=False):
        super().__init__()
        self.mlp, self.by_length = mlp, by_length
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, d))

    def forward(self, x):
        x = StraightThrough.apply(RowScale.apply(x, self.w))
        return self.mlp(LengthScaled.apply(x) if self.by_length else x)


def _dynamic_runs(by_length, lengths=(13, 17)):
    """(warnings, unit backward runs) per length of a dynamic compile, each checked exact."""
    lm, make_inputs = zoo.tiny_llama()
    for block in lm.layers:
        block.mlp = ScaledMLP(block.mlp, zoo.HIDDEN, by_length)
    ref, mine = copy.deepcopy(lm), copy.deepcopy(lm)
    torch._dynamo.reset()
    compiled = torch.compile(mine, backend="streambp", dynamic=True, options={"codegen": "eager", "chunk_size": 5})
    out = []
    for T in lengths:
        args = make_inputs(zoo.Case("t", 2, T)).args
        ref.zero_grad(set_to_none=True)
        mine.zero_grad(set_to_none=True)
        ref(*args)[0].backward()
        before = COUNTERS["unit_backward"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled(*args)[0].backward()
        assert_grads_match(grads_of(ref), grads_of(mine))
        out.append(([str(w.message) for w in caught if "streamfx" in str(w.message)],
                    COUNTERS["unit_backward"] - before))
    return out


def test_units_under_dynamic_shapes():
    """A dynamic compile passes the inputs' sizes into the Functions: a unit reads them from the
    tensors it gets, a chunk's for a chunk, at every length (the next test); a Function that reads
    the length as a number combines positions (a chunk would read its own length) and is refused,
    exactly."""
    (text, _), = _dynamic_runs(by_length=True, lengths=(13,))
    assert text and all("LengthScaled" in t and "sym_size" in t for t in text), text


def test_a_unit_with_symbolic_sizes_is_not_shared_with_another_compile(monkeypatch):
    """A unit's signature holds sizes as symbols ("s0"), which name a size only within the compile
    that made them: a second dynamic compile (after a reset) derives its units' signatures from
    its own symbols, while the layers of one compile share theirs. Nested applies on one line
    (``StraightThrough.apply(RowScale.apply(x, w))``) each get their own class's name."""
    from streamfx.passes import unit_axes, units

    computed = []
    original = unit_axes.signature

    def counting(unit, vals):
        computed.append((units._symbols_of(vals), unit.name))
        return original(unit, vals)

    monkeypatch.setattr(unit_axes, "signature", counting)
    for _ in range(2):
        before = len(computed)
        for (text, runs), chunks in zip(_dynamic_runs(by_length=False), (3, 4)):
            assert not text and runs == 2 * 2 * chunks, (text, runs)  # 2 layers x 2 units x chunks
        assert len(computed) > before, computed
    per_compile: dict = {}
    for serial, name in computed:
        per_compile.setdefault(serial, []).append(name)
    # (Dynamo may trace a frame twice, restarting its analysis: each trace is a compile of its own)
    assert None not in per_compile and len(per_compile) >= 2, computed
    assert all(sorted(names) == ["RowScale", "StraightThrough"] for names in per_compile.values()), computed


class Recomputed(torch.autograd.Function):
    """Runs layers without keeping their activations and recomputes them in its own backward (a
    reversible network's or a hand-written checkpoint's form), seeding the random generator first
    as Reformer's reversible layers do: Dynamo does not trace ``torch.manual_seed``."""

    @staticmethod
    def forward(ctx, x, layers, *params):
        torch.manual_seed(0)
        ctx.layers = layers
        ctx.save_for_backward(x)
        for layer in layers:
            x = layer(x)
        return x

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        params = list(ctx.layers.parameters())
        with torch.enable_grad():
            y = x = x.detach().requires_grad_()
            for layer in ctx.layers:
                y = layer(y)
            grads = torch.autograd.grad(y, [x, *params], g)
        return (grads[0], None, *grads[1:])


class RecomputedGPT(zoo.NanoGPT):
    """nanoGPT whose layers run in one Function call, as Reformer's encoder runs its layers."""

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        x = Recomputed.apply(x, self.transformer.h, *self.transformer.h.parameters())
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-100)


@pytest.mark.fast
def test_a_function_whose_forward_breaks_the_graph_runs_eagerly_and_says_where():
    """Dynamo compiles an ``autograd.Function`` whole or not at all: a graph break in its forward
    ends the graph before the ``apply`` and the Function runs eagerly, its forward under no_grad
    and its backward outside every graph, so the layers it runs never stream. The step is exact;
    one warning names the call, the break and what to change; the head after it still streams;
    strict raises."""
    _, make_inputs = zoo.nanogpt()
    torch.manual_seed(0)
    lm = RecomputedGPT().float().train()
    inputs = make_inputs(zoo.Case("t", 2, 13))
    run = run_eager_and_compiled(lm, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    _exact(run)
    assert [p.name for p in run.programs] == ["head"], [p.name for p in run.programs]
    assert len(run.warnings) == 1 and "autograd.Function" in run.warnings[0], run.warnings
    said = run.warnings[0]
    apply_line = RecomputedGPT.forward.__code__.co_firstlineno + 3
    seed_line = Recomputed.forward.__code__.co_firstlineno + 2
    assert f"test_function_units.py:{apply_line}" in said and f"test_function_units.py:{seed_line}" in said, said
    assert "manual_seed" in said and "Remove the graph break" in said, said
    torch._dynamo.reset()
    with pytest.raises(streamfx.StreamBPError, match="autograd.Function call at"):
        torch.compile(copy.deepcopy(lm), backend="streambp", options={"codegen": "eager", "strict": True})(*inputs.args)


class CheckpointedGPT(zoo.NanoGPT):
    """nanoGPT whose first layer runs under ``torch.utils.checkpoint`` and reads a value out of a
    tensor (a logged statistic) before its layer, which breaks the graph; the others are called
    directly."""

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        x = checkpoint(self.first, x, use_reentrant=self.reentrant)
        for layer in self.transformer.h[1:]:
            x = layer(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-100)

    def first(self, x):
        self.norms.append(x.norm().item())
        return self.transformer.h[0](x)


@pytest.mark.fast
@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_a_checkpointed_call_whose_function_breaks_the_graph_runs_eagerly_and_says_where(reentrant):
    """Dynamo traces a ``torch.utils.checkpoint`` call (a higher-order operator) whole or not at
    all: a graph break in the function it runs ends the graph before the call, which runs eagerly
    with Dynamo off inside, so the layer it runs never reaches the backend. The step is exact; one
    warning names the call, the break and what to change; the layer called directly (the second of
    two) and the head still stream; ``explain``'s report lists it; strict raises. Also under
    ``nested_graph_breaks`` (a higher-order operator does not resume inside)."""
    _, make_inputs = zoo.nanogpt()
    torch.manual_seed(0)
    lm = CheckpointedGPT().float().train()
    lm.norms, lm.reentrant = [], reentrant
    inputs = make_inputs(zoo.Case("t", 2, 13))
    call_line = CheckpointedGPT.forward.__code__.co_firstlineno + 3
    break_line = CheckpointedGPT.first.__code__.co_firstlineno + 1
    for nested in (False, True):
        torch._dynamo.reset()
        with torch._dynamo.config.patch(nested_graph_breaks=nested):
            run = run_eager_and_compiled(lm, inputs, {"chunk_size": 5, "head_chunk_size": 4})
        _exact(run)
        assert sorted(p.name for p in run.programs) == ["head", "layer.0"], [p.name for p in run.programs]
        assert len(run.warnings) == 1 and "higher-order operator" in run.warnings[0], run.warnings
        said = run.warnings[0]
        assert f"test_function_units.py:{call_line}" in said and f"test_function_units.py:{break_line}" in said, said
        assert "item" in said and "without torch.utils.checkpoint" in said, said
    # explain's report lists it, though it was warned before
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        report = streamfx.explain(copy.deepcopy(lm), *inputs.args, options={"chunk_size": 5}, dynamic=False)
    text = str(report)
    assert "run eagerly, outside every graph" in text and f"test_function_units.py:{call_line}" in text, text
    assert not [w for w in again if "higher-order operator" in str(w.message)], [str(w.message) for w in again]
    torch._dynamo.reset()
    with pytest.raises(streamfx.StreamBPError, match="higher-order operator"):
        torch.compile(copy.deepcopy(lm), backend="streambp", options={"codegen": "eager", "strict": True})(*inputs.args)


# ---- gradient hooks registered inside the model ------------------------------------------------
class GradHooked(torch.nn.Module):
    """``inner``'s output with a gradient hook registered on it inside the model
    (``y.register_hook(fn)``, as code that scales, clips or watches a gradient on its way back
    does): ``hook(module, grad)``. Dynamo captures it in the graph (torch >= 2.13: the
    ``register_hook`` operator, whose hook the joint's backward applies; before: a Function)."""

    def __init__(self, inner, hook):
        super().__init__()
        self.inner, self.hook = inner, hook
        self.gain = torch.nn.Parameter(torch.tensor(0.5))   # (read by a hook only: no gradient in eager)

    def forward(self, *args):
        y = self.inner(*args)
        if y.requires_grad:
            y.register_hook(lambda g: self.hook(self, g))
        return y


def _scaled(module, g):
    return g * 0.5


def _clipped(module, g):
    return g.clamp(-2e-3, 2e-3)


def _captured(module, g):
    return g * module.gain


def _watched(module, g):
    return None


def _normalized(module, g):   # (the norm sums over every token: no chunk has it)
    return g / g.norm()


@torch.library.custom_op("streamfx_test::halved", mutates_args=())
def _halved(g: torch.Tensor) -> torch.Tensor:
    return g * 0.5


@_halved.register_fake
def _(g):
    return torch.empty_like(g)


def _opaque(module, g):   # (an op of its own in the hook: not tensor math the unit can run)
    return _halved(g)


def _hooked_llama(hooks: dict):
    """The tiny Llama with ``hooks[site](module, grad)`` on each layer's ``attn``, ``mlp_norm``,
    ``q_proj``, ``k_proj`` output and the ``lm_head`` output (the logits)."""
    def wrap(block):
        for site in ("q_proj", "k_proj"):
            if site in hooks:
                setattr(block.attn, site, GradHooked(getattr(block.attn, site), hooks[site]))
        for site in ("attn", "mlp_norm"):
            if site in hooks:
                setattr(block, site, GradHooked(getattr(block, site), hooks[site]))

    lm, inputs = _llama(wrap)
    if "lm_head" in hooks:
        lm.lm_head = GradHooked(lm.lm_head, hooks["lm_head"])
    return lm, inputs


@pytest.mark.fast
@pytest.mark.heavy
def test_gradient_hooks_inside_the_model_stream_per_chunk():
    """A hook on an intermediate changes the gradient on its way back: streaming differentiates
    the forward again, so each hook runs as a unit (an identity forward, the hook as its backward)
    per chunk, with the tensors it captures. Every layer and the head stream, and the gradients
    are eager's: the hooks' halving and clipping included (differentiating again without them
    gives other gradients)."""
    hooks = {"attn": _scaled, "mlp_norm": _clipped, "q_proj": _watched, "k_proj": _captured, "lm_head": _scaled}
    lm, inputs = _hooked_llama(hooks)
    run = run_eager_and_compiled(lm, inputs, {"chunk_size": 5, "head_chunk_size": 4, "strict": True})
    _exact(run)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, run.warnings
    assert not run.warnings, run.warnings
    # per chunk: the attention's and the MLP norm's hook in 3 chunks of 2 layers, the logits' in 4
    assert run.counters["unit_backward"] >= 2 * 2 * 3 + 4, run.counters
    gain = "layers.0.attn.inner.k_proj.gain"   # (captured by the k_proj hook)
    assert run.grads[gain] is None and run.ref_grads[gain] is None, (run.grads[gain], run.ref_grads[gain])
    plain, _ = _hooked_llama({})
    plain.load_state_dict(lm.state_dict(), strict=False)
    unhooked = run_eager_and_compiled(plain, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    changed = (unhooked.ref_grads["lm_head.weight"] - run.ref_grads["lm_head.inner.weight"]).abs().max()
    assert changed > 1e-3 * run.ref_grads["lm_head.inner.weight"].abs().max(), "the hooks change no gradient"
    print(f"gradient hooks: max relative gradient error {_max_rel_error(run):.2e}")
    torch._dynamo.reset()
    lm2, inputs2 = _hooked_llama(hooks)
    report = streamfx.explain(lm2, *inputs2.args, options={"chunk_size": 5})
    where = {w for what, w in report.units if what.startswith("register_hook")}
    assert {"per chunk in layer.0", "per chunk in layer.1", "per chunk in head"} <= where, report.units
    assert "gradient hooks, each one op with its own backward" in str(report)


@pytest.mark.fast
@pytest.mark.parametrize("hook,streams", [(_normalized, ["head"]), (_opaque, [])], ids=["mixing", "opaque"])
def test_a_gradient_hook_that_cannot_run_per_chunk_is_refused_and_exact(hook, streams):
    """A hook that sums over every token (a normalised gradient) cannot run per chunk: its
    layers run unstreamed, the head streams, one warning names the hook, its op and its line.
    One that calls an op of its own cannot run as a unit: the graph runs unstreamed (streaming
    would drop it), and the warning says so. Exact either way; strict raises."""
    lm, inputs = _hooked_llama({"attn": hook})
    run = run_eager_and_compiled(lm, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    _exact(run)
    assert [p.name for p in run.programs] == streams, [p.name for p in run.programs]
    text = " ".join(run.warnings)
    assert "gradient hook (Tensor.register_hook)" in text and "test_function_units.py" in text, run.warnings
    if hook is _normalized:
        assert "combines positions along the sequence" in text, run.warnings
    torch._dynamo.reset()
    lm2, inputs2 = _hooked_llama({"attn": hook})
    with pytest.raises(streamfx.StreamBPError, match="gradient hook"):
        torch.compile(lm2, backend="streambp", options={"codegen": "eager", "strict": True})(*inputs2.args)


class HookedTwice(torch.nn.Module):
    """``form="early"``: the output read once before a hook is registered on it and once after
    (eager applies the hook to the gradient of both reads); ``form="two"``: two hooks that do not
    commute (a clip, then a scale: eager runs them in the order they were registered)."""

    def __init__(self, inner, form):
        super().__init__()
        self.inner, self.form = inner, form

    def forward(self, x):
        y = self.inner(x)
        if not y.requires_grad:
            return y
        if self.form == "early":
            z = y * 2
            y.register_hook(lambda g: g * 0.25)
            return z + y
        y.register_hook(lambda g: g.clamp(-1e-4, 1e-4))
        y.register_hook(lambda g: g * 100)
        return y


@pytest.mark.fast
@pytest.mark.parametrize("form", ["early", pytest.param("two", marks=pytest.mark.skipif(
    tuple(map(int, torch.__version__.split(".")[:2])) < (2, 13),
    reason="torch < 2.13's Dynamo chains a tensor's hooks in reverse order (aot_eager gives the same gradients)"))])
def test_gradient_hooks_apply_to_every_read_in_the_order_registered(form):
    """A hook applies to the tensor's whole gradient (reads before its registration included),
    and several hooks on one tensor run in the order they were registered: each unit goes right
    after the tensor's definition, a later one between the tensor and the earlier ones."""
    lm, inputs = _llama(lambda block: setattr(block, "mlp", HookedTwice(block.mlp, form)))
    run = run_eager_and_compiled(lm, inputs, {"chunk_size": 5, "head_chunk_size": 4, "strict": True})
    _exact(run)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, run.warnings
    assert not run.warnings, run.warnings


# ---- ops with side effects -------------------------------------------------------------------------
def _scaled_in_eager(x):
    return (x * 2.0,)


def _with_effects(kind):
    """The tiny Llama whose first MLP input goes through ``kind``: "leaf" a leaf function (its
    eager code runs as one opaque op with effects), "print" ATen's ordered ``_print``."""
    lm, make_inputs = zoo.tiny_llama()
    mlp = lm.layers[0].mlp
    inner = mlp.forward
    if kind == "leaf":
        from torch._dynamo.decorators import leaf_function

        scale = leaf_function(_scaled_in_eager)
        scale.register_fake(lambda x: (torch.empty_like(x),))
        mlp.forward = lambda x: inner(scale(x)[0])
    else:
        def printed(x):
            torch.ops.aten._print("streamfx test: an ordered effect")
            return inner(x)

        mlp.forward = printed
    return lm, make_inputs("prompt")


@pytest.mark.fast
@pytest.mark.parametrize("kind,says", [
    ("leaf", "a leaf function (torch._dynamo.decorators.leaf_function) is in the graph"),
    ("print", "an op with side effects (_print.default) is in the graph")])
def test_an_op_with_side_effects_leaves_its_graph_unstreamed_and_says_why(kind, says):
    """AOTAutograd orders an op with side effects (a leaf function's eager code, ATen's ``_print``)
    through effect tokens in the forward and the backward, which a joint differentiated again
    would not keep: the graph runs unstreamed, exact, one warning names the op and its line (was:
    a layer refused as token mixing, then the whole graph with a count of tangents); strict
    raises."""
    lm, inputs = _with_effects(kind)
    run = run_eager_and_compiled(lm, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    _exact(run)
    assert run.programs == [], [p.name for p in run.programs]
    [said] = run.warnings
    assert says in said and "test_function_units.py" in said, said
    torch._dynamo.reset()
    lm2, inputs2 = _with_effects(kind)
    with pytest.raises(streamfx.StreamBPError, match="side effects"):
        torch.compile(lm2, backend="streambp", options={"codegen": "eager", "strict": True})(*inputs2.args)
