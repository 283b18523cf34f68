"""Layer streaming: exact gradients per chunk size, no T x T tensors, fallbacks that warn."""
import copy
import warnings

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
import torch
import torch.nn.functional as F

import streamfx
from streamfx.runtime import COUNTERS, _PROGRAMS
from conftest import at_chunk_size
from test_analysis import TinyLM

import zoo
from tiers import examples
from streamfx.passes.schedule import chunk_count


def run_parity(model, args, options, rtol=1e-4):
    ref = copy.deepcopy(model)
    loss_ref = ref(*args)
    loss_ref.backward()
    compiled = torch.compile(model, backend="streambp", options=options, dynamic=False)
    loss = compiled(*args)
    loss.backward()
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        if r.grad is None:
            assert p.grad is None, name
            continue
        err = ((p.grad - r.grad).abs().max() / r.grad.abs().max().clamp_min(1e-30)).item()
        assert err <= rtol, f"{name}: relative gradient error {err:.2e}"


@pytest.mark.fast
@pytest.mark.parametrize("chunk", [1, 5, 16, 16 - 1, 17, 40])
@pytest.mark.parametrize("attn", ["sdpa", "matmul"])
def test_layer_parity_per_chunk_size(chunk, attn):
    torch.manual_seed(0)
    T = 16 if chunk != 17 else 17  # T-1, T and > T all appear
    model = TinyLM(V=24, d=16, H=2, layers=2, attn=attn)
    idx = torch.randint(0, 24, (2, T))
    before = COUNTERS["chunks_backward"]
    run_parity(model, (idx, idx), {"codegen": "eager", "chunk_size": chunk, "head_chunk_size": 7})
    layer_chunks = 2 * chunk_count(T, chunk)
    assert COUNTERS["chunks_backward"] - before >= layer_chunks


def test_layer_parity_inductor():
    torch.manual_seed(0)
    model = TinyLM(V=24, d=16, H=2, layers=3)
    idx = torch.randint(0, 24, (1, 19))
    compiles = COUNTERS["chunk_compiles"]
    run_parity(model, (idx, idx), {"chunk_size": 5, "head_chunk_size": 6})
    # head + one K/V graph and one query graph per distinct layer structure (not per layer),
    # each compiled twice: for inference (the forward) and for training (the backward)
    assert COUNTERS["chunk_compiles"] - compiles <= 2 * 5


@pytest.mark.fast
def test_no_token_by_token_tensor_in_streamed_graphs():
    torch.manual_seed(0)
    T, c = 32, 8
    model = TinyLM(V=24, d=16, H=2, layers=2, attn="sdpa")
    idx = torch.randint(0, 24, (1, T))
    report = streamfx.explain(model, idx, idx, options={"chunk_size": c, "head_chunk_size": c})
    assert sorted(p.name for p in report.plan) == ["head", "layer.0", "layer.1"]
    keys = [k for k, p in _PROGRAMS.items() if p.name.startswith("layer")][-2:]
    for key in keys:
        prog = _PROGRAMS[key]
        for gm in (prog.chunk_gm, prog.kv_gm):
            for n in gm.graph.nodes:
                v = n.meta.get("val")
                if isinstance(v, torch.Tensor):
                    assert v.numel() < T * T, f"{n.format_node()} holds {tuple(v.shape)}"


@pytest.mark.parametrize("name,pad", [("qwen3_sdpa", None), ("qwen3_sdpa", "right"), ("qwen3_eager", "left"),
                                      ("mistral_sliding", "left"), ("gemma3", None)])
def test_hf_masks_are_built_per_chunk(name, pad):
    """Hugging Face builds a [B, 1, T, T] mask (causal, with padding, packed-document ids from the
    positions, a sliding window) before the layers: the layers read the per-token values it is
    built from, and each chunk builds its own [B, 1, c, e] slice."""
    torch.manual_seed(0)
    T, c = 24, 5
    model, make_inputs = zoo.ZOO[name]()
    inputs = make_inputs(zoo.Case("t", 2, T, pad=pad))
    report = streamfx.explain(model, *inputs.args, options={"chunk_size": c}, **inputs.kwargs)
    layers = [(p, prog) for a in report.analyses for p, prog in a.programs if p.kind == "layer"]
    assert len(layers) == zoo.LAYERS
    for plan, prog in layers:
        assert plan.shared, f"{plan.name}: no mask node was moved into the layer"
        for x, spec in zip(plan.inputs, plan.in_specs):
            shape = tuple(x.meta["val"].shape)
            assert spec.kind != "qk" and shape.count(T) <= 1, f"{plan.name} reads {x.name} {shape}"
        for gm in (prog.chunk_gm, prog.kv_gm):
            for n in gm.graph.nodes:
                v = n.meta.get("val")
                if isinstance(v, torch.Tensor):
                    assert tuple(v.shape).count(T) <= 1, f"{n.format_node()} holds {tuple(v.shape)}"


@pytest.mark.parametrize("name", ["qwen3_sdpa", "gemma3"])
def test_rotary_tables_are_recomputed_per_chunk(name):
    """Rotary cos/sin ([T, head_dim] each, read by every layer) are computed from the position
    ids inside each layer, per chunk: the only floating-point per-token value a layer keeps is
    its input (the residual stream); the rest are integer positions and padding flags."""
    from conftest import assert_grads_match, run_eager_and_compiled

    T = 24
    model, make_inputs = zoo.ZOO[name]()
    inputs = make_inputs(zoo.Case("t", 2, T, pad="left"))
    report = streamfx.explain(model, *inputs.args, options={"chunk_size": 5}, **inputs.kwargs)
    layers = [p for p in report.plan if p.kind == "layer"]
    assert len(layers) == zoo.LAYERS
    for plan in layers:
        floating = [x for x in plan.saved if x.meta["val"].is_floating_point()]
        assert len(floating) == 1 and floating[0].meta["val"].shape[-1] == zoo.HIDDEN, (
            plan.name, [(x.name, tuple(x.meta["val"].shape)) for x in floating])
        assert any("cos" in str(n.target) for n in plan.shared), plan.name
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)


def test_grouped_kv_heads_are_not_repeated_per_chunk():
    """GQA (4 query heads, 2 K/V heads): the K/V buffers hold 2 heads and the chunk's fused CPU
    attention reads them as they are, with no repeated [B, 4, e, D] copy of the prefix."""
    T = 24
    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs(zoo.Case("t", 2, T, pad="left"))
    report = streamfx.explain(model, *inputs.args, options={"chunk_size": 5}, **inputs.kwargs)
    layers = [prog for a in report.analyses for p, prog in a.programs if p.kind == "layer"]
    assert len(layers) == zoo.LAYERS
    for prog in layers:
        kv = [n.meta["val"] for n in at_chunk_size(prog.kv, 5).graph.find_nodes(op="output")[0].args[0]]
        # per token of a chunk of 5: B=2 rows of KV_HEADS x HEAD_DIM values each, for K and for V
        assert [v.numel() // 5 for v in kv] == [2 * zoo.KV_HEADS * zoo.HEAD_DIM] * 2, kv
        sdpa = [n for n in prog.chunk_gm.graph.nodes if n.op == "call_function" and "attention" in str(n.target)]
        assert len(sdpa) == 1
        for x in sdpa[0].args[1:3]:
            assert x.meta["val"].shape[1] == zoo.KV_HEADS, x.format_node()


@pytest.mark.parametrize("name", ["qwen3_sdpa", "llama_tied", "mistral_sliding"])
def test_packed_documents_stream_exactly(name):
    """Documents packed into one row (position_ids restart at 0, no attention mask): Hugging Face
    masks attention across documents; the layers stream with that mask built per chunk, and the
    chunk boundaries (every 5 tokens) fall inside and across documents."""
    from conftest import assert_grads_match, run_eager_and_compiled

    T = 24
    model, make_inputs = zoo.ZOO[name]()
    position_ids = torch.cat([torch.arange(7), torch.arange(11), torch.arange(6)]).unsqueeze(0)
    inputs = make_inputs(zoo.Case("packed", 1, T), position_ids=position_ids)
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 5})
    layers = [p for p in run.programs if p.name.startswith("layer")]
    assert len({p.name for p in layers}) == zoo.LAYERS and run.counters["chunks_backward"] >= zoo.LAYERS * 5
    assert not run.warnings, run.warnings
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    # the documents are really separate: the loss differs from the same tokens as one document
    ref_one = model(**{k: v for k, v in inputs.kwargs.items() if k != "position_ids"}).loss
    assert (ref_one - run.ref_loss).abs() > 1e-4


@pytest.mark.parametrize("name,attn,pad,codegen", [("mistral_sliding", "sdpa", "left", "eager"),
                                                   ("mistral_sliding", "eager", "right", "eager"),
                                                   ("mistral_sliding", "sdpa", None, "inductor"),
                                                   ("gemma3", "eager", "left", "eager")])
def test_sliding_window_reads_only_the_window(name, attn, pad, codegen, monkeypatch):
    """A sliding window of W keys: a chunk [s, e) reads keys [max(0, s - W + 1), e), never the
    whole prefix, in the forward and the backward; gradients stay exact. Gemma3 alternates a
    sliding layer (W=4) with a global one, which reads every key up to e."""
    from conftest import assert_grads_match, run_eager_and_compiled
    from streamfx.passes.schedule import chunk_bounds
    from streamfx.runtime import LayerProgram

    reads = []
    prefix = LayerProgram.prefix

    def recording(self, bufs, lo, ke):
        reads.append((self.name, lo, ke))
        return prefix(self, bufs, lo, ke)

    monkeypatch.setattr(LayerProgram, "prefix", recording)
    T, c = 16, 3
    model, make_inputs = zoo.ZOO[name](attn=attn)
    W = model.config.sliding_window
    run = run_eager_and_compiled(model, make_inputs(zoo.Case("t", 2, T, pad=pad)), {"chunk_size": c, "codegen": codegen})
    assert not run.warnings, run.warnings
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    sliding = {"mistral_sliding": {"layer.0", "layer.1"}, "gemma3": {"layer.0"}}[name]
    assert {r[0] for r in reads} == {"layer.0", "layer.1"}
    start_of = {e: s for s, e in chunk_bounds(T, c)}  # chunk end -> chunk start (16 in chunks of 3: the last two of 2 rows)
    wide = [r for r in reads if r[1:3] == (0, T)]
    # a padding row can see no key (left padding; right padding past the window): HF's eager
    # attention then averages it over every key, so its chunk reads all of them ("wide")
    assert bool(wide) == (pad is not None and attn == "eager"), wide
    for layer, lo, ke in reads:
        if (lo, ke) == (0, T):
            continue
        expected = max(0, start_of[ke] - W + 1) if layer in sliding else 0
        assert lo == expected, (layer, lo, ke)
    widths = [ke - lo for layer, lo, ke in reads if layer in sliding and (lo, ke) != (0, T)]
    assert max(widths) == c + W - 1 < T


class ConvLM(torch.nn.Module):
    """Blocks of causal attention followed by a depthwise convolution along the sequence that
    reads the next token too (padded on both sides): not causal."""

    def __init__(self, V=24, d=16, layers=2):
        super().__init__()
        self.inner = TinyLM(V, d, 2, layers=layers)
        self.conv = torch.nn.ModuleList(torch.nn.Conv1d(d, d, 3, groups=d) for _ in range(layers))

    def forward(self, idx, targets):
        m = self.inner
        h = m.emb(idx)
        B, T, _ = h.shape
        for qkv, conv in zip(m.qkv, self.conv):
            q, k, v = qkv(h).split(h.shape[-1], dim=2)
            q, k, v = (t.view(B, T, 2, -1).transpose(1, 2) for t in (q, k, v))
            h = h + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
            h = h + conv(F.pad(h.transpose(1, 2), (1, 1))).transpose(1, 2)
        logits = m.head(h)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


@pytest.mark.fast
@pytest.mark.parametrize("make", [lambda: ConvLM(), lambda: TinyLM(24, 16, 2, layers=2, attn="bidirectional")],
                         ids=["causal-conv", "non-causal-attention"])
def test_fallback_is_exact_and_warns(make):
    torch.manual_seed(0)
    model = make()
    idx = torch.randint(0, 24, (2, 12))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_parity(model, (idx, idx), {"codegen": "eager", "chunk_size": 4})
    messages = [str(w.message) for w in caught if "streamfx" in str(w.message)]
    assert messages, "a region that cannot stream must warn"
    assert any(("test_layers.py" in m and ("pad" in m or "convolution" in m)) or "not causal" in m for m in messages), messages


@pytest.mark.fast
@pytest.mark.parametrize("make", [lambda: ConvLM(), lambda: TinyLM(24, 16, 2, layers=2, attn="bidirectional")],
                         ids=["causal-conv", "non-causal-attention"])
def test_strict_refuses(make):
    model = make()
    idx = torch.randint(0, 24, (1, 12))
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "strict": True})
    with pytest.raises(streamfx.StreamBPError, match="strict"):
        compiled(idx, idx)


class _AttendingLM(TinyLM):
    def heads(self, h):
        """Queries, keys and values of ``h`` [B, T, d] as [B, H, T, d / H]."""
        B, T = h.shape[:2]
        q, k, v = self.qkv[0](h).split(h.shape[-1], dim=2)
        return (t.view(B, T, self.H, -1).transpose(1, 2) for t in (q, k, v))

    def loss(self, h, targets):
        return F.cross_entropy(self.head(h).view(-1, self.head.out_features), targets.view(-1))


def _seeded_step(model, args: tuple, seed: int, loss_of=lambda out: out, **options):
    """(loss, parameter gradients, streamfx warnings) of one step of a fresh copy of ``model``
    called on ``args``, compiled with ``options`` (FX graphs), with the random seed set before
    the call; ``loss_of`` reads the loss from the call's output."""
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    compiled = torch.compile(m, backend="streambp", options={"codegen": "eager", **options})
    torch.manual_seed(seed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = loss_of(compiled(*args))
        loss.backward()
    return loss.detach(), [p.grad for p in m.parameters()], [str(w.message) for w in caught
                                                              if "streamfx" in str(w.message)]


@pytest.mark.fast
def test_dropout_randomness_is_drawn_once_and_replayed_per_chunk():
    """Dropout's random mask is drawn outside the streamed layer and read per chunk, so chunked
    recomputation sees exactly the forward's randomness: gradients with 3 chunks equal those
    with 1 chunk under the same seed."""

    class DropLM(_AttendingLM):
        def forward(self, idx, targets):
            B, T = idx.shape
            h = self.emb(idx)
            y = F.scaled_dot_product_attention(*self.heads(h), is_causal=True).transpose(1, 2).reshape(B, T, -1)
            return self.loss(h + F.dropout(y, 0.3, training=True), targets)

    torch.manual_seed(0)
    model = DropLM(24, 16, 2)
    idx = torch.randint(0, 24, (1, 12))
    grads = [_seeded_step(model, (idx, idx), 123, chunk_size=chunk)[1] for chunk in (4, 12)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    report = streamfx.explain(copy.deepcopy(model), idx, idx, options={"chunk_size": 4})
    assert "layer.0" in [p.name for p in report.plan]


class _Checkpointed(torch.nn.Module):
    """A layer the model checkpoints itself (``torch.utils.checkpoint``), as plain PyTorch
    training code does without Hugging Face's ``gradient_checkpointing`` flag."""

    def __init__(self, layer, reentrant: bool):
        super().__init__()
        self.layer, self.reentrant = layer, reentrant

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.layer, x, use_reentrant=self.reentrant)


class _DroppedMLP(torch.nn.Module):
    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return F.dropout(self.mlp(x), 0.3, training=True)


def _checkpointing_nanogpt(reentrant: bool, dropout: bool = False):
    model, make_inputs = zoo.nanogpt()
    if dropout:
        for block in model.transformer.h:
            block.mlp = _DroppedMLP(block.mlp)
    model.transformer.h = torch.nn.ModuleList(_Checkpointed(b, reentrant) for b in model.transformer.h)
    return model, make_inputs


@pytest.mark.fast
@pytest.mark.parametrize("reentrant", [False, pytest.param(True, marks=pytest.mark.heavy)], ids=["non-reentrant", "reentrant"])
def test_layers_the_model_checkpoints_itself_stream_exactly(reentrant):
    """A model whose forward wraps each layer in ``torch.utils.checkpoint.checkpoint`` (either
    form) streams every layer, exactly and with nothing to warn about: the checkpoint's own
    recomputation is subsumed by the chunks'. With dropout inside the checkpointed layers, the
    randomness is drawn once: 4-token chunks give the gradients of one whole chunk."""
    from conftest import assert_grads_match, run_eager_and_compiled

    model, make_inputs = _checkpointing_nanogpt(reentrant)
    inputs = make_inputs("odd17")
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert not run.warnings, run.warnings
    n = chunk_count(inputs.T, 5)
    layers = {p.name for p in run.programs if p.name.startswith("layer")}
    assert layers == {f"layer.{i}" for i in range(zoo.LAYERS)}, sorted(p.name for p in run.programs)
    assert all(set(run.schedules[name]) == {n} for name in layers), run.schedules

    dropped, make_inputs = _checkpointing_nanogpt(reentrant, dropout=True)
    inputs = make_inputs("odd17")
    grads = [_seeded_step(dropped, inputs.args, 123, inputs.loss_of, chunk_size=chunk)[1] for chunk in (4, inputs.T)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


class _ProbDropLM(_AttendingLM):
    """Dropout on the attention probabilities: SDPA's ``dropout_p`` ("sdpa"), or ``F.dropout``
    after a hand-written softmax under a ``-inf`` causal mask ("manual") or, as Hugging Face's
    eager attention does, an additive ``finfo.min`` mask with the softmax in fp32
    ("manual_fp32_softmax")."""

    def __init__(self, form, *args):
        super().__init__(*args)
        self.form = form

    def forward(self, idx, targets):
        B, T = idx.shape
        h = self.emb(idx)
        q, k, v = self.heads(h)
        if self.form == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.25)
        else:
            s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
            if self.form == "manual":
                s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
                p = s.softmax(-1)
            else:  # an additive mask, as Hugging Face's eager attention adds its causal mask
                s = s + torch.full((T, T), torch.finfo(s.dtype).min).triu(1)
                p = F.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
            y = F.dropout(p, 0.25, training=True) @ v
        return self.loss(h + y.transpose(1, 2).reshape(B, T, -1), targets)


@pytest.mark.fast
@pytest.mark.parametrize("form", ["sdpa", "manual", "manual_fp32_softmax"])
def test_dropout_on_attention_probabilities_streams_and_replays_per_chunk(form):
    """Dropout on the attention probabilities (SDPA's ``dropout_p`` in training, or
    ``F.dropout`` after a hand-written softmax, fused or, computed in fp32 as Hugging Face's eager
    attention does, decomposed into exp / sum / div) multiplies the normalised probabilities: it
    is no mask on the scores beside the causal one. The layer streams (strict: nothing refused) and the
    keep mask drawn in the forward is read per chunk, so gradients with 4 chunks equal those with
    1 under the same seed. Its keep mask is kept per layer whole ([B, H, T, T]): one warning says
    that memory grows with the square of the length, and what to change."""

    torch.manual_seed(0)
    model = _ProbDropLM(form, 24, 16, 2)
    idx = torch.randint(0, 24, (2, 12))
    grads, losses = [], []
    for chunk in (3, 12):
        loss, grad, said = _seeded_step(model, (idx, idx), 123, chunk_size=chunk, strict=True)
        assert len(said) == 1 and "square of the length" in said[0] and "attention_dropout=0.0" in said[0], said
        losses.append(loss)
        grads.append(grad)
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-6, atol=1e-7)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # the dropout really acted: a different seed gives a different loss
    assert not torch.allclose(_seeded_step(model, (idx, idx), 7, chunk_size=3)[0], losses[0])
    report = streamfx.explain(copy.deepcopy(model), idx, idx, options={"chunk_size": 3})
    assert "layer.0" in [p.name for p in report.plan] and not report.not_streamed, report


def test_hf_eager_attention_with_dropout_streams_as_inductor_rewrites_it():
    """Hugging Face's eager attention (an additive mask, the softmax in fp32) with dropout on the
    probabilities, under Inductor's codegen: its joint-graph passes rewrite the attention into
    SDPA's decomposition, whose ``_safe_softmax`` gives rows with every key hidden zeros (an
    ``any`` over the keys of the scores, read back through ``logical_not`` and ``where``). The
    layer streams (strict), its randomness drawn once: 4 chunks give the loss and gradients of
    Inductor's own compile (its random numbers, the same under the same seed)."""

    torch.manual_seed(0)
    model = _ProbDropLM("manual_fp32_softmax", 24, 16, 2)
    idx = torch.randint(0, 24, (2, 12))
    loss, grads, said = _seeded_step(model, (idx, idx), 123, chunk_size=3, codegen="inductor", strict=True)
    torch._dynamo.reset()
    ref = copy.deepcopy(model)
    torch.manual_seed(123)
    ref_loss = torch.compile(ref, backend="inductor")(idx, idx)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-6, atol=1e-7)
    for a, b in zip(grads, [p.grad for p in ref.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(_seeded_step(model, (idx, idx), 7, chunk_size=3, codegen="inductor")[0], loss)


@settings(max_examples=examples(7), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_layer_streaming_property(data):
    """Random (T, chunk size, batch, padding side and length, prompt span, GQA ratio, sliding
    window, attention implementation) on a Mistral-style model: loss and every gradient match
    eager autograd, and the layers really stream in the schedule's chunks (``chunk_count``)."""
    from conftest import assert_grads_match, run_eager_and_compiled
    from transformers import MistralConfig, MistralForCausalLM

    T = data.draw(st.integers(2, 20), "T")
    chunk = data.draw(st.integers(1, T + 3), "chunk")
    B = data.draw(st.integers(1, 3), "B")
    pad = data.draw(st.sampled_from([None, "left", "right"]), "pad")
    n_pad = data.draw(st.integers(1, T - 1), "n_pad") if pad and T > 2 else 0
    ignore = data.draw(st.one_of(st.none(), st.tuples(st.integers(0, T - 1), st.integers(1, T)).filter(
        lambda r: r[0] < r[1])), "prompt")
    kv_heads = data.draw(st.sampled_from([1, 2, 4]), "kv_heads")
    window = data.draw(st.one_of(st.none(), st.integers(1, T + 2)), "window")
    attn = data.draw(st.sampled_from(["sdpa", "eager"]), "attn")
    torch._dynamo.reset()
    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=zoo.VOCAB, hidden_size=zoo.HIDDEN, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=zoo.HEAD_DIM,
                        max_position_embeddings=zoo.MAX_POS, sliding_window=window, pad_token_id=zoo.PAD_ID,
                        tie_word_embeddings=False)
    model = zoo._hf(MistralForCausalLM, cfg, attn)
    case = zoo.Case("h", B, T, pad=pad if n_pad else None, n_pad=n_pad, ignore=ignore)
    inputs = zoo._hf_inputs(zoo.VOCAB)(case)
    if (inputs.kwargs["labels"][:, 1:] == -100).all():
        return  # no token is scored: the loss is NaN in eager too
    run = run_eager_and_compiled(model, inputs, {"chunk_size": chunk, "head_chunk_size": max(1, chunk - 1)})
    assert not run.warnings, run.warnings
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    for name in ("layer.0", "layer.1"):
        assert run.schedules.get(name) and set(run.schedules[name]) == {chunk_count(T, chunk)}, run.schedules


@pytest.mark.fast
@pytest.mark.parametrize("attn, attention, head_grad", [
    ("sdpa", "recompute", "forward"), ("sdpa", "keep", "recompute"), ("matmul", "recompute", "forward")])
def test_a_float64_model_streams_to_float64_precision(attn, attention, head_grad):
    """A float64 model's streamed step is float64 throughout: the head's loss sums and the
    gradients it stores in the forward, the K/V gradients' accumulators, and a fused attention's
    log-sum-exp (the CPU kernel's is float64 for float64 inputs) are float64, not float32. The
    loss and every gradient agree with eager to float64 rounding: float32 anywhere on the way
    leaves errors near 1e-8."""
    from conftest import record_schedules

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = TinyLM(V=40, d=16, H=2, layers=2, attn=attn).double()
    idx = torch.randint(0, 40, (2, 13))
    targets = idx.clone()
    targets[0, :3] = -100
    ref = copy.deepcopy(model)
    ref_loss = ref(idx, targets)
    ref_loss.backward()
    compiled = torch.compile(model, backend="streambp", options={
        "codegen": "eager", "chunk_size": 4, "head_chunk_size": 4, "attention": attention,
        "head_grad": head_grad, "strict": True})
    with warnings.catch_warnings(record=True) as caught, record_schedules() as schedules:
        warnings.simplefilter("always")
        loss = compiled(idx, targets)
        loss.backward()
    assert not [str(w.message) for w in caught if "streamfx" in str(w.message)]
    assert set(schedules) == {"layer.0", "layer.1", "head"} and all(set(n) == {4} for n in schedules.values()), \
        dict(schedules)
    assert loss.dtype == torch.float64
    assert abs(loss.item() - ref_loss.item()) <= 1e-13 * abs(ref_loss.item()), (loss.item(), ref_loss.item())
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        error = ((p.grad - r.grad).abs().max() / r.grad.abs().max()).item()
        assert error <= 1e-11, (name, error)


class _FlatNoiseLayer(torch.nn.Module):
    """Attention, then an MLP over the tokens flattened to ``[B*T, 2d]`` scaled by random numbers
    drawn flat, one per token (``rand(B*T, 1)``: Phi-3.5-MoE's router draws its noise this way)."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv, self.o = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.up, self.down = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x, gate=None):
        B, T, d = x.shape
        q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d))
        noise = torch.rand(B * T, 1, device=x.device) + 0.5 if gate is None else gate
        return x + self.down(F.gelu(self.up(x).reshape(B * T, -1) * noise)).reshape(B, T, d)


class _FlatNoiseLM(torch.nn.Module):
    def __init__(self, vocab=32, d=16, layers=2):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, vocab)
        self.layers = torch.nn.ModuleList(_FlatNoiseLayer(d) for _ in range(layers))

    def forward(self, idx, targets):
        x = self.emb(idx)
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


@pytest.mark.fast
@pytest.mark.parametrize("codegen", ["eager", pytest.param("inductor", marks=pytest.mark.heavy)])
def test_an_input_drawn_flat_over_batch_and_tokens_is_read_per_chunk(codegen):
    """A layer input laid out ``[B*T, 1]`` (random numbers drawn flat beside the tokens flattened
    to ``[B*T, 2d]``) streams: each chunk reads rows [s, e) of every batch row's tokens as one
    ``[B*c, 1]`` block. Same seed, same draws: loss and gradients equal eager's (B=3, 20 tokens,
    chunks of 6: 6, 6, 6, 2), and every layer streamed. (Under Inductor with torch's own random
    ops, ``fallback_random``, so that the draws are eager's.)"""
    model = _FlatNoiseLM()
    ref = copy.deepcopy(model)
    idx, targets = torch.randint(0, 32, (3, 20)), torch.randint(0, 32, (3, 20))
    torch.manual_seed(7)
    ref(idx, targets).backward()
    compiled = torch.compile(model, backend="streambp", options={"codegen": codegen, "chunk_size": 6, "strict": True})
    before = COUNTERS["region_forward"]
    # (the config's own patch: pytest's monkeypatch restores a config option by deleting it)
    with torch._inductor.config.patch(fallback_random=True):
        torch.manual_seed(7)
        loss = compiled(idx, targets)
        loss.backward()
    assert COUNTERS["region_forward"] - before == 3   # (both layers and the head)
    layers = [p for p in _PROGRAMS.values() if p.kind == "layer" and any(s.merged for s in p.in_specs)]
    assert layers and all(str(s) == "chunk(0,inner)" for p in layers for s in p.in_specs if s.merged)
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-5, atol=1e-6, msg=name)


class _FlatGateLM(torch.nn.Module):
    """A trained per-token gate computed once from the embedding, flat (``[B*T, 1]``), and read by
    every layer's MLP over its tokens flattened to ``[B*T, 2d]``: a layer input that merges the
    batch and the sequence and needs a gradient."""

    def __init__(self, vocab=32, d=16, layers=2):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.gate, self.head = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, 1), torch.nn.Linear(d, vocab)
        self.layers = torch.nn.ModuleList(_FlatNoiseLayer(d) for _ in range(layers))

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.emb(idx)
        gate = torch.sigmoid(self.gate(x)).reshape(B * T, 1)
        for layer in self.layers:
            x = layer(x, gate)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


@pytest.mark.fast
@pytest.mark.parametrize("codegen", ["eager", pytest.param("inductor", marks=pytest.mark.heavy)])
def test_an_input_merged_over_batch_and_tokens_gets_its_gradient_per_chunk(codegen):
    """A flat ``[B*T, 1]`` layer input that needs a gradient (a trained gate computed from the
    embedding in the first layer's region and read by the next): each chunk's gradient rows go
    back to rows [s, e) of every batch row. Gradients equal eager's (B=3, 20 tokens, chunks of 6),
    every layer streamed, strict."""
    model = _FlatGateLM()
    ref = copy.deepcopy(model)
    idx, targets = torch.randint(0, 32, (3, 20)), torch.randint(0, 32, (3, 20))
    ref(idx, targets).backward()
    compiled = torch.compile(model, backend="streambp", options={"codegen": codegen, "chunk_size": 6, "strict": True})
    before, known = COUNTERS["region_forward"], set(_PROGRAMS)
    compiled(idx, targets).backward()
    assert COUNTERS["region_forward"] - before == 3   # (both layers and the head)
    merged = [p for k, p in _PROGRAMS.items() if k not in known and p.kind == "layer"
              and any(p.in_specs[i].merged for i in p.grad_inputs)]
    assert merged, "no layer read the gate as a merged input with a gradient"
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-5, atol=1e-6, msg=name)


class _RouteRowExperts(torch.nn.Module):
    """Top-k experts that give each route its own row (Ergo's: ``x.repeat_interleave(k, 0)``),
    sort the routes by expert, gather their rows by the sort's positions, scale each by its
    expert's weights, put them back in route order and sum a token's routes."""

    def __init__(self, d=16, experts=4, k=2):
        super().__init__()
        self.k, self.router = k, torch.nn.Linear(d, experts)
        self.scale = torch.nn.Parameter(torch.randn(experts, d))

    def forward(self, x):
        B, T, d = x.shape
        flat = x.reshape(-1, d)
        weights, ids = self.router(flat).softmax(-1).topk(self.k)       # [N, k]
        routes = flat.repeat_interleave(self.k, dim=0)                  # [N*k, d]: a row per route
        expert = ids.reshape(-1)
        perm = torch.sort(expert, stable=True).indices
        out = torch.tanh(routes[perm] * self.scale[expert[perm]])
        back = torch.empty_like(out).index_put((perm,), out)
        return (back.view(-1, self.k, d) * weights.unsqueeze(-1)).sum(1).view(B, T, d)


class _RouteRowLM(_FlatNoiseLM):
    """``_FlatNoiseLM`` with a gate of ones and route-row experts after each layer."""

    def __init__(self, vocab=32, d=16, layers=2):
        super().__init__(vocab, d, layers)
        self.experts = torch.nn.ModuleList(_RouteRowExperts(d) for _ in range(layers))

    def forward(self, idx, targets):
        x = self.emb(idx)
        for layer, experts in zip(self.layers, self.experts):
            x = layer(x, torch.ones(1))
            x = x + experts(x)
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


@pytest.mark.fast
def test_experts_that_repeat_each_token_per_route_stream():
    """A row per route made by repeating each token's row: the gather by route positions reads
    copies of the token's own row (any copy is the same), so every layer streams, strict, with
    gradients equal to eager's (B=2, 20 tokens, chunks of 6)."""
    model = _RouteRowLM()
    ref = copy.deepcopy(model)
    idx, targets = torch.randint(0, 32, (2, 20)), torch.randint(0, 32, (2, 20))
    ref(idx, targets).backward()
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "chunk_size": 6, "strict": True})
    before = COUNTERS["region_forward"]
    compiled(idx, targets).backward()
    assert COUNTERS["region_forward"] - before == 3   # (both layers and the head)
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-5, atol=1e-6, msg=name)
