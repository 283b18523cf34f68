"""Causal convolutions along the sequence (LFM2's and Mamba's short convolutions): a layer whose
token mixing is a 1-D convolution padded on the left streams, each chunk reading its own rows
and the ``reach`` rows before them; a convolution that reads later rows is refused at its line."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

import streamfx
from streamfx.passes.schedule import chunk_bounds
from streamfx.runtime import COUNTERS, LayerProgram
import zoo
from tiers import cases


class ConvMixLM(torch.nn.Module):
    """Layers of a gated convolution along the sequence, as LFM2's convolution layers (``B * x``
    convolved, gated by ``C``), optionally beside causal attention in the same layer.

    ``form``: how the convolution is made causal or not:
      "slice"   conv1d(x, padding=P)[..., :T]       (P = (k - 1) * dilation; Hugging Face's form)
      "pad"     conv1d(F.pad(x, (P, 0)))             (padded on the left)
      "chain"   two convolutions after one left pad of both their reaches (Zaya's form)
      "same"    conv1d(x, padding=P // 2)            (centred: reads later rows)
      "future"  conv1d(F.pad(x, (0, P)))             (padded on the right: reads later rows only)
      "shifted" conv1d(x, padding=P)[..., 1:T + 1]   (cut one row late: reads the next row)
    """

    def __init__(self, form="slice", V=24, d=16, layers=2, k=3, dilation=1, groups=None, bias=True,
                 attention=False):
        super().__init__()
        self.form, self.P, self.attention = form, (k - 1) * dilation, attention
        pad = {"slice": self.P, "shifted": self.P, "same": self.P // 2}.get(form, 0)
        g = d if groups is None else groups
        self.emb, self.head = torch.nn.Embedding(V, d), torch.nn.Linear(d, V)
        self.proj = torch.nn.ModuleList(torch.nn.Linear(d, 3 * d) for _ in range(layers))
        self.conv = torch.nn.ModuleList(torch.nn.Conv1d(d, d, k, groups=g, padding=pad, dilation=dilation, bias=bias)
                                        for _ in range(layers))
        self.conv2 = torch.nn.ModuleList(torch.nn.Conv1d(d, d, 2, groups=g, bias=bias) for _ in range(layers))
        self.out = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(layers))
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d, 3 * d) for _ in range(layers))

    def mix(self, i, x):
        T = x.shape[-1]
        conv = self.conv[i]
        if self.form in ("slice", "same"):
            y = conv(x)
            return y[..., :T] if self.form == "slice" else y
        if self.form == "pad":
            return conv(F.pad(x, (self.P, 0)))
        if self.form == "chain":
            return self.conv2[i](conv(F.pad(x, (self.P + 1, 0))))
        if self.form == "future":
            return conv(F.pad(x, (0, self.P)))
        return conv(x)[..., 1:T + 1]

    def forward(self, idx, targets):
        h = self.emb(idx)
        B, T, d = h.shape
        for i in range(len(self.proj)):
            b, c, x = self.proj[i](h).transpose(1, 2).chunk(3, dim=1)
            y = (c * self.mix(i, b * x)).transpose(1, 2)
            if self.attention:
                q, k, v = (t.view(B, T, 2, -1).transpose(1, 2) for t in self.qkv[i](h).split(d, dim=2))
                y = y + F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d)
            h = h + self.out[i](y)
        return F.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


def _step(model, idx, options):
    """The eager step and the compiled one on a copy: (loss error, worst relative gradient error,
    warnings of streamfx, the layers' key reads (name, lo, hi))."""
    torch._dynamo.reset()
    ref = copy.deepcopy(model)
    ref_loss = ref(idx, idx)
    ref_loss.backward()
    reads = []
    prefix = LayerProgram.prefix

    def recording(self, bufs, lo, ke):
        reads.append((self.name, lo, ke))
        return prefix(self, bufs, lo, ke)

    LayerProgram.prefix = recording
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = torch.compile(model, backend="streambp", options=options, dynamic=False)(idx, idx)
            loss.backward()
    finally:
        LayerProgram.prefix = prefix
    errs = [((p.grad - r.grad).abs().max() / r.grad.abs().max()).item()
            for p, r in zip(model.parameters(), ref.parameters()) if r.grad is not None]
    said = [str(w.message) for w in caught if "streamfx" in str(w.message)]
    return (loss - ref_loss).abs().item(), max(errs), said, reads


CAUSAL = {"slice": {}, "pad": {}, "dilated": {"dilation": 2}, "dilated-pad": {"form": "pad", "k": 4, "dilation": 3},
          "chain": {"form": "chain"}, "full": {"groups": 1}, "grouped": {"groups": 4, "bias": False},
          "beside-attention": {"attention": True}}


@pytest.mark.fast
@pytest.mark.parametrize("case,chunk", cases([(c, n) for c in CAUSAL for n in (1, 3, 16)],
                                             [("slice", 1), ("slice", 3), ("pad", 3), ("dilated", 1),
                                              ("dilated-pad", 3), ("chain", 1), ("full", 3), ("grouped", 16),
                                              ("beside-attention", 3)]))
def test_causal_convolutions_stream_exactly(case, chunk):
    """Every layer streams (strict), gradients match eager autograd for chunks smaller than the
    convolution's reach, equal and larger, and each chunk [s, e) reads rows [s - reach, e) of the
    convolution's input, not the whole prefix (a layer with attention beside it: [0, e))."""
    kw = dict(CAUSAL[case])
    torch.manual_seed(0)
    model = ConvMixLM(form=kw.pop("form", "slice" if case != "pad" else "pad"), **kw)
    T = 13
    idx = torch.randint(0, 24, (2, T))
    before = COUNTERS["chunks_backward"]
    loss_err, err, said, reads = _step(model, idx, {"chunk_size": chunk, "head_chunk_size": 5, "codegen": "eager",
                                                    "strict": True})
    assert not said, said
    assert loss_err <= 1e-5 and err <= 1e-5, (loss_err, err)
    assert COUNTERS["chunks_backward"] - before >= 2 * len(chunk_bounds(T, chunk)), "the layers did not stream"
    reach = {"dilated": 4, "dilated-pad": 9, "chain": 3}.get(case, 2)
    start_of = {e: s for s, e in chunk_bounds(T, chunk)}
    assert {r[0] for r in reads} == {"layer.0", "layer.1"}
    for _, lo, ke in reads:
        assert lo == (0 if model.attention else max(0, start_of[ke] - reach)), (lo, ke)


@pytest.mark.heavy
def test_causal_convolutions_stream_under_inductor_at_every_length():
    """Inductor's code for the chunk graphs, compiled once with symbolic sizes (at the second
    length, where Dynamo turns dynamic): later lengths and batch sizes reuse it, exactly (the
    convolution of a chunk runs as its taps, whose code does not depend on the length)."""
    torch.manual_seed(0)
    model = ConvMixLM(form="slice")
    ref = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="streambp", options={"chunk_size": 4, "head_chunk_size": 5,
                                                                 "strict": True})
    compiles = None
    for i, (B, T) in enumerate(((2, 11), (3, 17), (2, 9), (4, 23))):
        idx = torch.randint(0, 24, (B, T))
        for p in (*model.parameters(), *ref.parameters()):
            p.grad = None
        ref(idx, idx).backward()
        compiled(idx, idx).backward()
        for p, r in zip(model.parameters(), ref.parameters()):
            if r.grad is None:   # (the second convolution of the "chain" form)
                assert p.grad is None
                continue
            assert ((p.grad - r.grad).abs().max() / r.grad.abs().max()).item() <= 1e-5
        if i == 1:
            compiles = dict(COUNTERS)
    for key in ("chunk_compiles", "vjp_compiles", "guard_recompiles"):
        assert COUNTERS[key] == compiles[key], f"a later length or batch size compiled again ({key})"


@pytest.mark.fast
@pytest.mark.parametrize("form,op", [("same", "aten.convolution"), ("future", "aten.constant_pad_nd"),
                                     ("shifted", "aten.convolution")])
def test_a_convolution_that_reads_later_rows_is_refused(form, op):
    """A centred convolution, one padded on the right, and one cut a row late read rows after
    their own: the layers run unstreamed, exactly, with a warning that names the op and its line
    and says what makes a convolution stream; strict raises."""
    torch.manual_seed(0)
    model = ConvMixLM(form=form)
    idx = torch.randint(0, 24, (2, 13))
    loss_err, err, said, _ = _step(model, idx, {"chunk_size": 3, "head_chunk_size": 5, "codegen": "eager"})
    assert loss_err <= 1e-5 and err <= 1e-5, (loss_err, err)
    assert any(op in w and "test_convolutions.py" in w and "padded on the left only" in w for w in said), said
    torch._dynamo.reset()
    with pytest.raises(streamfx.StreamBPError, match="strict"):
        torch.compile(copy.deepcopy(model), backend="streambp", options={"strict": True, "codegen": "eager"},
                      dynamic=False)(idx, idx)


class ConvolvedKeysLM(torch.nn.Module):
    """Causal attention whose keys are convolved along the sequence first (a short convolution of
    the keys, as Inkling's and Zaya's): the attention reads its keys (scaled first, where SDPA's
    math path runs) from a convolution of the projection's rows."""

    def __init__(self, V=24, d=16):
        super().__init__()
        self.emb, self.head = torch.nn.Embedding(V, d), torch.nn.Linear(d, V)
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        # (no bias: a bias added to every key moves every score of a query alike, so the softmax
        # gives it no gradient)
        self.conv = torch.nn.Conv1d(d, d, 3, groups=d, padding=2, bias=False)

    def forward(self, idx, targets):
        h = self.emb(idx)
        B, T, d = h.shape
        q, k, v = self.qkv(h).split(d, dim=2)
        k = self.conv(k.transpose(1, 2))[..., :T].transpose(1, 2)
        q, k, v = (t.reshape(B, T, 2, -1).transpose(1, 2) for t in (q, k, v))
        h = h + self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d))
        return F.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


def _kv_rows(fn):
    """``fn()`` with the K/V graph's reads recorded: [(region, s, e, rows of its per-row inputs)]."""
    reads, kv_inputs = [], LayerProgram.kv_inputs

    def recording(self, inputs, s, e):
        xs = kv_inputs(self, inputs, s, e)
        specs = self.kv_specs or self.in_specs
        reads.append((self.name, s, e, {x.shape[spec.dim] for x, spec in zip(xs, specs)
                                        if spec.kind in ("chunk", "prefix")}))
        return xs

    LayerProgram.kv_inputs = recording
    try:
        return fn(), reads
    finally:
        LayerProgram.kv_inputs = kv_inputs


@pytest.mark.fast
@pytest.mark.parametrize("chunk,codegen", [(1, "eager"), (2, "eager"), (5, "eager"), (16, "eager"),
                                           pytest.param(3, "inductor", marks=pytest.mark.heavy)])
def test_convolved_keys_stream(chunk, codegen):
    """The convolution runs in the K/V graph, each chunk's over its own rows and the 2 before them
    (the rows' reach), whose outputs only the chunk's own rows are kept of: the layer streams
    (strict), gradients match eager autograd for chunks smaller than the reach, equal and larger,
    and the convolution's input is not kept for the whole sequence (two K/V buffers: the keys and
    the values)."""
    from streamfx.runtime import _PROGRAMS

    torch.manual_seed(0)
    idx = torch.randint(0, 24, (2, 13))
    before = set(_PROGRAMS)
    (loss_err, err, said, reads), kv = _kv_rows(lambda: _step(
        ConvolvedKeysLM(), idx, {"chunk_size": chunk, "head_chunk_size": 5, "codegen": codegen, "strict": True}))
    assert not said, said
    assert loss_err <= 1e-5 and err <= 1e-5, (loss_err, err)
    assert {r[0] for r in reads} == {"layer.0"} and {r[0] for r in kv} == {"layer.0"}
    for _, s, e, rows in kv:
        assert rows == {e - max(0, s - 2)}, (s, e, rows)
    layers = [p for key, p in _PROGRAMS.items() if key not in before and p.kind == "layer"]
    assert [p.kv_reach for p in layers] == [2] and len(layers[0].kv_dims) == 2


class ShiftLM(torch.nn.Module):
    """Attention layers with token shifts: the input mixed with the previous token's (RWKV's time
    mix) and values delayed by a token (Zaya's). ``form``: how the shift is written:
      "cat"   cat([row, x[:, :-1]], 1)   (row: a projection of zeros, as Zaya's first delayed value)
      "cat2"  cat([zeros, x[:, :-2]], 1) (two tokens back)
      "pad"   F.pad(x, (0, 0, 1, -1))    (RWKV's ZeroPad2d((0, 0, 1, -1)))
      "next"  cat([x[:, 1:], zeros], 1)  (the next token: not causal)
    """

    def __init__(self, form, V=24, d=16):
        super().__init__()
        self.form = form
        self.emb, self.head = torch.nn.Embedding(V, d), torch.nn.Linear(d, V)
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.first = torch.nn.Linear(d, d)
        self.mu = torch.nn.Parameter(torch.rand(d))

    def shift(self, x):
        if self.form == "cat":
            return torch.cat([self.first(x.new_zeros(x.shape[0], 1, x.shape[2])), x[:, :-1]], dim=1)
        if self.form == "cat2":
            return torch.cat([x.new_zeros(x.shape[0], 2, x.shape[2]), x[:, :-2]], dim=1)
        if self.form == "pad":
            return F.pad(x, (0, 0, 1, -1))
        return torch.cat([x[:, 1:], x.new_zeros(x.shape[0], 1, x.shape[2])], dim=1)

    def forward(self, idx, targets):
        h = self.emb(idx)
        B, T, d = h.shape
        for _ in range(2):
            x = h + (self.shift(h) - h) * self.mu
            q, k, v = self.qkv(x).split(d, dim=2)
            q, k, v = (t.reshape(B, T, 2, -1).transpose(1, 2) for t in (q, k, self.shift(v)))
            h = h + self.out(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, d))
        return F.cross_entropy(self.head(h).flatten(0, 1), targets.flatten())


@pytest.mark.fast
@pytest.mark.parametrize("form,chunk,codegen", [("cat", 1, "eager"), pytest.param("cat", 3, "inductor", marks=pytest.mark.heavy),
                                                ("cat2", 1, "eager"), ("cat2", 3, "eager"), ("pad", 1, "eager"),
                                                ("pad", 16, "eager"), pytest.param("pad", 3, "inductor", marks=pytest.mark.heavy)])
def test_token_shifts_stream(form, chunk, codegen):
    """A token shift is a causal mixing of reach n: both layers stream (strict), exactly, for chunks
    of one row, a few and all; the shift of the layer's input runs in the K/V graph over the
    chunk's rows and the n before them."""
    torch.manual_seed(0)
    idx = torch.randint(0, 24, (2, 13))
    (loss_err, err, said, reads), kv = _kv_rows(lambda: _step(
        ShiftLM(form), idx, {"chunk_size": chunk, "head_chunk_size": 5, "codegen": codegen, "strict": True}))
    assert not said, said
    assert loss_err <= 1e-5 and err <= 1e-5, (loss_err, err)
    assert {r[0] for r in reads} == {"layer.0", "layer.1"}
    n = 2 if form == "cat2" else 1
    for _, s, e, rows in kv:
        assert rows == {e - max(0, s - n)}, (s, e, rows)


@pytest.mark.fast
def test_a_shift_from_the_next_token_is_refused():
    """Rows moved earlier read the next token: the layers run unstreamed, exactly, warned at the op."""
    torch.manual_seed(0)
    idx = torch.randint(0, 24, (2, 13))
    loss_err, err, said, reads = _step(ShiftLM("next"), idx, {"chunk_size": 3, "head_chunk_size": 5,
                                                              "codegen": "eager"})
    assert loss_err <= 1e-5 and err <= 1e-5, (loss_err, err)
    assert len(said) == 1 and "aten.slice" in said[0] and "test_convolutions.py" in said[0], said
    assert not reads


def _lfm2(types, k=3):
    from transformers import Lfm2Config, Lfm2ForCausalLM

    cfg = Lfm2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=len(types),
                     num_attention_heads=4, num_key_value_heads=2, layer_types=types, conv_L_cache=k,
                     use_cache=False, block_multiple_of=16, block_auto_adjust_ff_dim=False)
    return Lfm2ForCausalLM(cfg).float()


@pytest.mark.fast
@pytest.mark.heavy
@pytest.mark.parametrize("pad", [None, "left"])
def test_lfm2_convolution_layers_stream(pad):
    """Hugging Face's LFM2 with convolution layers around an attention layer, through its own
    ``causal_conv1d_fn`` (the reference implementation): every layer and the head stream
    (strict), exactly, with a padded batch too."""
    from conftest import assert_grads_match, run_eager_and_compiled

    torch.manual_seed(0)
    model = _lfm2(["conv", "full_attention", "conv"])
    inputs = zoo._hf_inputs(64)(zoo.Case("t", 2, 15, pad=pad))
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 4, "head_chunk_size": 5, "strict": True})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "layer.2", "head"}, run.warnings
    text = str(streamfx.explain(_lfm2(["conv", "full_attention", "conv"]), *inputs.args, **inputs.kwargs,
                                options={"chunk_size": 4}, dynamic=False))
    assert "causal convolution in model.layers.0.conv" in text, text
    assert "a chunk reads its own rows and the 2 before them" in text, text


@pytest.mark.fast
def test_a_chunks_convolution_rows_are_picked_on_the_convolutions_device():
    """The index that picks a chunk's rows of the convolution's output is made on the device of
    the convolution (from the joint graph), not the default one: on a GPU a CPU index would fail."""
    from streamfx.runtime import _PROGRAMS

    torch.manual_seed(0)
    torch._dynamo.reset()
    before = set(_PROGRAMS)
    idx = torch.randint(0, 24, (2, 13))
    torch.compile(ConvMixLM(), backend="streambp", options={"chunk_size": 4, "codegen": "eager", "strict": True},
                  dynamic=False)(idx, idx).backward()
    aranges = [n for key, prog in _PROGRAMS.items() if key not in before and prog.kind == "layer"
               for n in prog.chunk.gm.graph.nodes if n.target is torch.ops.aten.arange.start]
    assert aranges and all(n.kwargs.get("device") == torch.device("cpu") for n in aranges), \
        [n.kwargs for n in aranges]


@pytest.mark.fast
@pytest.mark.heavy
@pytest.mark.parametrize("model", [ConvolvedKeysLM, lambda: ShiftLM("pad")],
                         ids=["convolved-keys", "token-shift"])
def test_plan_memory_predicts_a_step_whose_kv_graph_reads_rows_before_the_chunks(model):
    """The K/V graph that reads the rows before a chunk's has key-length sizes only: the memory
    model still predicts the step, growing with the length, and explain() shows it."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    idx = torch.randint(0, 24, (2, 13))
    report = streamfx.plan_memory(model(), idx, idx, options={"chunk_size": 4})
    assert 0 < report.step_peak(1024) < report.step_peak(8192)
    torch._dynamo.reset()
    text = str(streamfx.explain(model(), idx, idx, options={"chunk_size": 4}, dynamic=False))
    assert "predicted step peak at T=13" in text and "not available" not in text, text
    assert "each chunk's runs over its own rows and the" in text, text


@pytest.mark.parametrize("pad", ["left", "right"])
@pytest.mark.skipif(not zoo.moe_streams(), reason="transformers < 5.24: grouped_mm_fallback's backward reads "
                    "offs.tolist() (Zaya's fp32 experts); tests/test_untraceable.py checks the refusal")
def test_zaya_with_padding_streams_exactly(pad):
    """Hugging Face's Zaya (queries and keys convolved together, values delayed a token, router
    states handed from layer to layer beside the residual stream) with three layers on a padded
    batch: every layer and the head stream (strict), the K/V graph's convolution reads the rows
    before each chunk under the padding mask, and gradients match eager autograd."""
    import arch_configs
    from conftest import assert_grads_match, run_eager_and_compiled

    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "ZayaForCausalLM"):
        pytest.skip("the installed transformers has no Zaya")
    torch.manual_seed(0)
    cfg = arch_configs.tiny_config("zaya")
    cfg.num_hidden_layers, cfg.layer_types = 3, cfg.layer_types[:1] * 3
    model = transformers.ZayaForCausalLM(cfg).float()
    inputs = zoo._hf_inputs(cfg.vocab_size)(zoo.Case("t", 2, 15, pad=pad))
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 4, "strict": True})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "layer.2", "head"}, run.warnings
    assert all(p.kv_reach >= 1 for p in run.programs if p.kind == "layer")


def _bf16_errors(model, idx, options):
    """(loss error, worst relative gradient error) against the fp32 eager step, of eager bf16 and
    of the compiled bf16 step, on copies of ``model`` (the same weights)."""
    torch._dynamo.reset()
    ref = copy.deepcopy(model)
    ref_loss = ref(idx, idx)
    ref_loss.backward()
    out = []
    for compiled in (False, True):
        mine = copy.deepcopy(model).to(torch.bfloat16)
        run = torch.compile(mine, backend="streambp", options=options, dynamic=False) if compiled else mine
        loss = run(idx, idx)
        loss.backward()
        errs = [((p.grad.float() - r.grad).abs().max() / r.grad.abs().max()).item()
                for p, r in zip(mine.parameters(), ref.parameters()) if r.grad is not None]
        out.append(((loss.float() - ref_loss).abs().item(), max(errs)))
    return out


@pytest.mark.parametrize("name", ["convolved-keys", "shift", "chain-beside-attention"])
def test_bf16_kv_graphs_that_read_rows_before_the_chunk_within_eager_bf16_error(name):
    """bf16 layers whose K/V graph convolves or shifts the rows before each chunk (their input
    gradients summed over those rows, chunk after chunk): every layer streams (strict) and the
    error against the fp32 eager step is within the error eager bf16 itself has there."""
    torch.manual_seed(0)
    model = {"convolved-keys": lambda: ConvolvedKeysLM(),
             "shift": lambda: ShiftLM("cat"),
             "chain-beside-attention": lambda: ConvMixLM("chain", attention=True)}[name]()
    idx = torch.randint(0, 24, (2, 29))
    before = COUNTERS["region_backward"]
    (eager_loss, eager_grad), (loss, grad) = _bf16_errors(
        model, idx, {"chunk_size": 4, "head_chunk_size": 8, "codegen": "eager", "strict": True})
    layers = 1 if name == "convolved-keys" else 2
    assert COUNTERS["region_backward"] - before == layers + 1
    assert loss <= 2 * eager_loss + 1e-3, (loss, eager_loss)
    assert grad <= 2 * eager_grad + 1e-2, (grad, eager_grad)
