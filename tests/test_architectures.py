"""Attention forms beyond causal softmax attention: every layer streams, exactly.

  sinks     gpt-oss: a learned per-head logit in every row's softmax denominator (cat + slice)
  alibi     Bloom-style: a per-key linear bias, the input of ``baddbmm`` (read over each chunk's keys)
  chunked   Llama 4 ``attention_chunk_size``: a chunk [s, e) reads keys [floor(s / C) * C, e)
  falcon    Falcon 7B: multi-query K/V read as ``qkv[..., [-2], :]`` (an index over heads: token-local)
  bloom     Hugging Face Bloom: ALiBi from the attention mask's cumulative sum, ``baddbmm`` scores
  mla       DeepSeek-V3 latent attention: K/V from a per-token latent, keys assembled by slice_scatter
"""
import contextlib
import copy
import re
import warnings

import pytest
import torch
import torch.nn.functional as F

import streamfx
import zoo
from conftest import assert_grads_match, record_schedules, run_eager_and_compiled
from streamfx.passes.schedule import chunk_count

PLAIN = ("sinks", "alibi", "chunked", "mla")
HF = ("falcon", "bloom")
T = 16


def check(name, case, options, *, T=T):
    model, make_inputs = zoo.FORMS[name]()
    inputs = make_inputs(case)
    run = run_eager_and_compiled(model, inputs, options)
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert not run.warnings, run.warnings
    layers = {p.name for p in run.programs if p.name.startswith("layer")}
    assert layers == {f"layer.{i}" for i in range(zoo.LAYERS)}, (sorted(layers), run.warnings)
    chunk = options.get("chunk_size")
    if chunk is not None:
        n = chunk_count(inputs.T, chunk)
        for name_ in layers:  # forward, then the backward's recomputation: every run in n chunks
            assert run.schedules[name_] and set(run.schedules[name_]) == {n}, (name_, run.schedules)
    return run


SLOW = pytest.mark.slow


# every form at chunk 5 (fast tier; the sinks form's default run only) and at two of the other
# four sizes (slow tier, alternating by form: each size on two forms)
FORM_CHUNKS = [pytest.param(name, 5, marks=[pytest.mark.fast] + ([pytest.mark.heavy] if name == "sinks" else []),
                             id=f"{name}-5") for name in PLAIN] + [
    pytest.param(name, chunk, marks=SLOW, id=f"{name}-{chunk}") for i, name in enumerate(PLAIN)
    for j, chunk in enumerate([1, T - 1, T, T + 7]) if (i + j) % 2 == 0]


@pytest.mark.parametrize("name, chunk", FORM_CHUNKS)
def test_forms_at_every_chunk_size(name, chunk):
    check(name, "prompt", {"chunk_size": chunk, "head_chunk_size": 4})


@pytest.mark.parametrize("case", ["left_pad", "prompt", pytest.param("right_pad", marks=[SLOW, pytest.mark.extended]),
                                  pytest.param("odd13", marks=[SLOW, pytest.mark.extended])])
@pytest.mark.parametrize("name", HF)
def test_hf_forms_with_padding_and_prompts(name, case):
    check(name, case, {"chunk_size": 5})


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [1, pytest.param(T - 1, marks=pytest.mark.extended), pytest.param(T + 7, marks=pytest.mark.extended)])
@pytest.mark.parametrize("name", HF)
def test_hf_forms_at_every_chunk_size(name, chunk):
    check(name, "left_pad", {"chunk_size": chunk})


# Inductor codegen: test_dynamic.py::test_forms_every_length_inductor runs each form (and the MoE)
# through a static compile, a symbolic one and later lengths.


@contextlib.contextmanager
def recorded_key_ranges():
    from streamfx.runtime import LayerProgram

    seen, original = [], LayerProgram.key_ranges

    def key_ranges(self, inputs, bounds):
        result = original(self, inputs, bounds)
        seen.append((list(bounds), list(result)))
        return result

    LayerProgram.key_ranges = key_ranges
    try:
        yield seen
    finally:
        LayerProgram.key_ranges = original


@pytest.mark.fast
def test_chunked_attention_reads_keys_from_its_block_start():
    """Blocks of C=4 tokens, chunks of 5: chunk [s, e) reads keys [floor(s / 4) * 4, e), not [0, e)."""
    model, make_inputs = zoo.chunked()
    assert model.chunk == 4
    with recorded_key_ranges() as seen:
        run_eager_and_compiled(model, make_inputs("prompt"), {"chunk_size": 5})
    assert seen
    for bounds, ranges in seen:
        assert ranges == [(s // 4 * 4, e) for s, e in bounds], (bounds, ranges)


@pytest.mark.parametrize("form, codegen, chunk", [pytest.param("mla", "eager", 5, marks=[pytest.mark.fast, pytest.mark.heavy]),
                                                 pytest.param("mla_cat", "eager", 5, marks=pytest.mark.extended)] + [
    pytest.param("mla", codegen, chunk, marks=SLOW if (codegen, chunk) == ("inductor", 5)
                 else [SLOW, pytest.mark.extended]) for codegen, chunk in
    [("eager", 1), ("eager", T - 1), ("eager", T + 7), ("inductor", 1), ("inductor", 5), ("inductor", T + 7)]])
def test_mla_can_keep_the_latent_not_the_heads(monkeypatch, form, codegen, chunk):
    """With ``kv_boundary="latent"`` MLA's K/V graph ends at the compressed latent and the rotary
    key (r + dr = 12 values per token), not at the per-head keys and values (H * (dn + dr) +
    H * dv = 80): the full-length buffers (and their fp32 gradients) hold the latent, and each
    chunk up-projects the prefix it reads. Exact, every layer streamed, in every chunk."""
    import streamfx
    from streamfx.runtime import LayerProgram

    kept, keys_values = [], LayerProgram.keys_values

    def recording(self, inputs, fn_kv):  # the full-length buffers, as the first chunk allocates them
        for i, item in enumerate(keys_values(self, inputs, fn_kv)):
            if i == 0:
                kept.append([tuple(b.shape) for b in item[3]])
            yield item

    monkeypatch.setattr(LayerProgram, "keys_values", recording)
    model, make_inputs = zoo.FORMS[form]()
    attn = model.layers[0].attn
    inputs = make_inputs("prompt")
    options = {"chunk_size": chunk, "head_chunk_size": 4, "codegen": codegen, "kv_boundary": "latent"}
    check(form, "prompt", options)
    B, T_ = inputs.args[0].shape
    assert len(kept) == 2 * zoo.LAYERS, kept  # the forward and the backward of each layer
    for shapes in kept:
        values = sum(torch.Size(s).numel() for s in shapes) // (B * T_)
        assert values == attn.r + attn.dr, shapes
    text = str(streamfx.explain(model, *inputs.args, options=options, dynamic=False))
    assert text.count("a latent the keys and values are computed from per chunk") == zoo.LAYERS, text


@pytest.mark.fast
@pytest.mark.parametrize("dtype, assemble, heads, dn, latent", [
    # the zoo's MLA in fp32: what each chunk rebuilds from the latent (keys written into an empty
    # tensor, then scaled) outweighs the per-head buffers
    pytest.param(torch.float32, "scatter", zoo.HEADS, 8, False, marks=pytest.mark.heavy),
    # bf16, keys by cat, one head dim (fused attention reads them as they are), 16 heads from
    # a 12-wide latent: the per-head buffers and their fp32 accumulators outweigh it
    pytest.param(torch.bfloat16, "cat", 16, 12, True, marks=pytest.mark.heavy),
])
def test_mla_kv_boundary_auto_takes_the_latent_where_it_holds_less(dtype, assemble, heads, dn, latent):
    """``kv_boundary="auto"`` (the default) weighs the bytes a layer's backward holds for its
    keys: the per-head buffers and fp32 accumulators, against the latent's plus what the longest
    chunk rebuilds from it (``passes.kv.kept_bytes``)."""
    import streamfx

    torch.manual_seed(0)
    model = zoo.MLALM(n_head=heads, r=8, dn=dn, dv=16, assemble=assemble).to(dtype).train()
    ids, _, labels = zoo.tokens(zoo._case("b1"), zoo.VOCAB)
    text = str(streamfx.explain(model, ids, labels, options={"chunk_size": 5}, dynamic=False))
    assert text.count("K/V graph keeps") == zoo.LAYERS, text
    assert text.count("a latent the keys and values are computed from per chunk") == (zoo.LAYERS if latent else 0), text


def test_sink_gradient_is_streamed():
    """The sinks' gradient (a sum over every query of the sink's share of the softmax) leaves the
    streamed layer, equal to eager's."""
    run = check("sinks", "b1", {"chunk_size": 3})
    names = [n for n in run.grads if n.endswith("sinks")]
    assert len(names) == zoo.LAYERS and all(run.grads[n].abs().max() > 0 for n in names)


@pytest.mark.fast
@pytest.mark.heavy
def test_explain_names_the_forms():
    import streamfx

    model, make_inputs = zoo.chunked()
    inputs = make_inputs("b1")
    text = str(streamfx.explain(model, *inputs.args, options={"chunk_size": 5}, dynamic=False))
    assert "mask=chunked(4)" in text, text


class ConvLM(torch.nn.Module):
    """No attention: a centred depthwise convolution mixes tokens (each row reads the next too)."""

    def __init__(self, vocab=zoo.VOCAB, d=zoo.HIDDEN, k=3):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.conv = torch.nn.Conv1d(d, d, k, groups=d, padding=(k - 1) // 2)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)
        self.vocab = vocab

    def forward(self, idx, labels):
        x = self.embed(idx)
        x = x + self.conv(x.transpose(1, 2)).transpose(1, 2)
        logits = self.lm_head(x)
        shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, self.vocab), shifted.reshape(-1)), logits


@pytest.mark.fast
def test_no_attention_warns_once_and_the_head_streams():
    import streamfx

    torch.manual_seed(0)
    model = ConvLM()
    inputs = zoo._plain_inputs(zoo.VOCAB)("odd13")
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    assert_grads_match(run.ref_grads, run.grads)
    said = [w for w in run.warnings if "no causal attention found: layers run unstreamed; the head streams" in w]
    assert len(said) == 1 and "aten.convolution" in said[0] and "test_architectures.py" in said[0], run.warnings
    assert [p.name for p in run.programs] and {p.name for p in run.programs} == {"head"}
    text = str(streamfx.explain(model, *inputs.args, options={"chunk_size": 5}, dynamic=False))
    assert "no causal attention found: layers run unstreamed; the head streams" in text, text


class _KeyBiasLayer(torch.nn.Module):
    """Causal attention whose mask adds a per-key bias computed from the values (Doge's
    ``dt_states``), ``hidden`` the [T, T] positions no query sees; ``select=True``: the mask
    keeps, beside each query itself, only the keys whose values score above zero (a selection
    per key the layer makes from its own rows); ``bias=False``: a plain causal layer (``hidden``
    unused)."""

    def __init__(self, d=zoo.HIDDEN, heads=2, bias=True, select=False):
        super().__init__()
        self.heads, self.qkv, self.out = heads, torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.dt = torch.nn.Linear(d, heads) if bias else None
        self.select = select

    def forward(self, x, hidden=None):
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, d // self.heads).unbind(2)
        mask = None
        if self.dt is not None and self.select:
            keep = (self.dt(v.reshape(B, T, d)) > 0).transpose(1, 2)   # [B, H, T]
            mask = (keep[:, :, None, :] | torch.eye(T, dtype=torch.bool, device=x.device)) & ~hidden
        elif self.dt is not None:
            per_key = F.softplus(self.dt(v.reshape(B, T, d))).transpose(1, 2)   # [B, H, T]
            mask = per_key[:, :, None, :].expand(-1, -1, T, -1).masked_fill(hidden, torch.finfo(x.dtype).min)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                           is_causal=mask is None)
        return x + self.out(o.transpose(1, 2).reshape(B, T, d))


class PairScanLM(torch.nn.Module):
    """A scan in Mamba's parallel form (its ``associative_scan`` traced): the sequence viewed as
    [T/2, 2] pairs, combined within each pair, merged back and added to the layer's input times a
    per-channel weight. ``attention``: a causal attention layer after it (a hybrid model)."""

    def __init__(self, vocab=zoo.VOCAB, d=zoo.HIDDEN, attention=False):
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.mix = torch.nn.Embedding(vocab, d), torch.nn.Linear(d, d)
        self.D = torch.nn.Parameter(torch.randn(d))
        self.attn = _KeyBiasLayer(d, bias=False) if attention else None
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)
        self.vocab = vocab

    def forward(self, idx, labels):
        x = self.embed(idx)
        B, T, d = x.shape
        pairs = torch.tanh(self.mix(x)).view(B, T // 2, 2, d)
        scanned = torch.cat([pairs[:, :, :1], pairs[:, :, :1] + pairs[:, :, 1:]], dim=2).reshape(B, T, d)
        x = x + scanned + x * self.D
        if self.attn is not None:
            x = self.attn(x)
        logits = self.lm_head(x)
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        return F.cross_entropy(logits.reshape(-1, self.vocab), shifted.reshape(-1)), logits


@pytest.mark.fast
@pytest.mark.parametrize("attention", [False, True])
def test_a_scan_that_splits_the_sequence_leaves_the_other_regions_streaming(attention):
    """The scan's pairs merged back beside the layer's input line up a product of two new axes
    with the sequence: the sequence stays one axis (the product is written as it), so the head
    streams, and so does a causal attention layer after the scan. The view that splits the tokens
    into pairs combines positions (no chunk holds a pair cut at its edge): warned at its line."""
    model = PairScanLM(attention=attention)
    inputs = zoo._plain_inputs(zoo.VOCAB)("prompt")
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    assert_grads_match(run.ref_grads, run.grads)
    assert sorted(p.name for p in run.programs) == (["head", "layer.0"] if attention else ["head"]), run.warnings
    said = [w for w in run.warnings if "aten.view" in w and "pairs = torch.tanh" in w]
    assert len(said) == 1, run.warnings


class KeyBiasLM(torch.nn.Module):
    """A plain causal layer, then one whose mask adds a bias per key (``select=False``) or keeps
    the keys its values select (``select=True``)."""

    def __init__(self, vocab=zoo.VOCAB, d=zoo.HIDDEN, select=True):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList([_KeyBiasLayer(d, bias=False), _KeyBiasLayer(d, select=select)])
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)
        self.vocab = vocab

    def forward(self, idx, labels):
        T = idx.shape[1]
        hidden = torch.ones(T, T, dtype=torch.bool, device=idx.device).triu(1)
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, hidden)
        logits = self.lm_head(x)
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        return F.cross_entropy(logits.reshape(-1, self.vocab), shifted.reshape(-1)), logits


@pytest.mark.fast
def test_a_mask_selecting_keys_from_the_layers_own_rows_is_refused_with_the_cause(monkeypatch):
    """A layer whose mask hides keys by a selection the layer computes from its own rows (which
    keys a chunk's queries see is known only once the layer has run over every key) runs
    unstreamed, warned with that cause, what to change, the op that selects and its line; the
    other layer and the head stream, and every gradient is eager's. strict=True raises."""
    monkeypatch.setenv("STREAMFX_VERIFY", "0")   # (as users run: a refusal is a warning)
    _only_layer_1_runs_whole(KeyBiasLM(), "the mask hides keys by a selection per key that the layer computes from "
                             "its own activations", ["compute the selection before the layers", "aten.gt",
                                                     "keep = (self.dt("], "a selection per key that the layer computes")


@pytest.mark.fast
def test_the_memory_terms_of_an_unstreamed_layer_name_their_module_and_line(monkeypatch):
    """explain()'s predicted peak names every term as the user knows it, the backward of a layer
    that runs unstreamed too: a weight's gradient product by the module it differentiates and the
    forward line of that module's call (the streamed step's joint is traced with each node's
    meta current, as AOTAutograd traces Dynamo's graph)."""
    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    model = KeyBiasLM()
    inputs = zoo._plain_inputs(zoo.VOCAB)("prompt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (layer.1's refusal: test above)
        report = streamfx.explain(model, *inputs.args, options={"chunk_size": 5})
    rows = report.memory()[4]
    assert rows and all(module or src for _, _, module, src in rows), rows
    weight_grad = [r for r in rows if r[1].startswith("backward mm result [96, 32]")]
    assert weight_grad and all(r[2] == "layers.1.qkv" and "self.qkv(x)" in r[3] for r in weight_grad), rows


@pytest.mark.fast
def test_a_region_that_does_not_instantiate_per_chunk_leaves_the_others_streaming(monkeypatch):
    """A layer whose graph fails at chunk shapes (here the softplus of its bias per key, made to
    fail when propagated at symbolic chunk shapes) runs unstreamed, warned with the failure, the op and
    its line; the other layer and the head stream, and every gradient is eager's. strict=True
    raises."""
    from streamfx import chunks

    monkeypatch.setenv("STREAMFX_VERIFY", "0")   # (as users run: a failure is a warning)
    monkeypatch.setattr(chunks, "_CHECKED", {})  # (the failure is cached per graph: this test's alone)
    real = chunks._Propagation.run_node

    def run_node(self, n):
        if n.target is torch.ops.aten.softplus.default:
            self.at = self._positions[n]   # (where the propagation stands, as its own run_node sets it)
            raise RuntimeError("no chunk shape for this op")
        return real(self, n)

    monkeypatch.setattr(chunks._Propagation, "run_node", run_node)
    _only_layer_1_runs_whole(KeyBiasLM(select=False), "the region does not instantiate per chunk (RuntimeError: no "
                             "chunk shape for this op)", ["aten.softplus", "per_key = F.softplus("],
                             "does not instantiate per chunk")


def _only_layer_1_runs_whole(model, cause, details, strict_match):
    """``model`` (a ``KeyBiasLM``) streams its head and layer.0 and runs layer.1 whole with eager's
    gradients, warned once with ``cause`` and each of ``details``; strict=True raises
    ``strict_match``."""
    inputs = zoo._plain_inputs(zoo.VOCAB)("prompt")
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    assert_grads_match(run.ref_grads, run.grads)
    assert sorted(p.name for p in run.programs) == ["head", "layer.0"], run.warnings
    said = [w for w in run.warnings if f"region 'layer.1' is not streamed: {cause}" in w]
    assert len(said) == 1 and all(d in said[0] for d in details), run.warnings
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "strict": True, "chunk_size": 5})
    with pytest.raises(streamfx.StreamBPError, match=strict_match):
        compiled(*inputs.args)


def _broken_regions(fwd_nodes, sd, sites, *rest):
    node = sites[0].output  # the pass was looking at this node when it failed
    raise RuntimeError(f"an analysis bug at {node.name}")


@pytest.mark.fast
@pytest.mark.heavy
def test_a_pass_failure_runs_unstreamed_with_a_warning(monkeypatch):
    """A bug in a pass never reaches the user: the graph runs exactly, unstreamed, and the warning
    names the failure, the op the pass was working on and its source line; strict=True raises."""
    import streamfx
    from streamfx.passes import pipeline

    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    monkeypatch.setattr(pipeline, "find_regions", _broken_regions)
    model, make_inputs = zoo.tiny_llama()
    inputs = make_inputs("odd13")
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5})
    assert_grads_match(run.ref_grads, run.grads)
    assert not run.programs
    assert len(run.warnings) == 1, run.warnings
    w = run.warnings[0]
    assert "the streaming passes failed (RuntimeError: an analysis bug" in w and "scaled_dot_product" in w \
        and "zoo.py" in w and "runs without streaming" in w, w
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "strict": True})
    with pytest.raises(streamfx.StreamBPError, match="the streaming passes failed"):
        compiled(*inputs.args)


@pytest.mark.fast
@pytest.mark.parametrize("T", [1, 7, 16])
def test_mask_patterns(T):
    from streamfx.passes.masks import pattern

    pos = torch.arange(T)
    causal = pos[:, None] >= pos[None, :]
    assert pattern(causal) == ("causal", None)
    if T > 4:
        assert pattern(causal & (pos[:, None] // 4 == pos[None, :] // 4)) == ("chunked", 4)
        assert pattern(causal & (pos[:, None] - pos[None, :] < 3)) == ("sliding-window", 3)
        assert pattern(causal & (pos[None, :] > 0)) == (None, None)   # the first row sees no key
        assert pattern(torch.ones(T, T, dtype=torch.bool)) == (None, None)


def _analyse(fn, *args):
    from torch.fx.experimental.proxy_tensor import make_fx

    from streamfx.passes import seq_dims

    gm = make_fx(torch.func.functionalize(fn))(*args)
    sd = seq_dims.infer_axes(gm.graph)
    x = gm.graph.find_nodes(op="placeholder")[0]
    sd.set_seq(sd.axes[x][0][1][0])  # the input's dim 1 is the sequence
    return gm, sd


def _by_target(gm, op):
    return [n for n in gm.graph.nodes if n.target is op]


@pytest.mark.fast
def test_index_over_heads_is_token_local_and_over_tokens_mixes():
    """Falcon's ``qkv[..., [-2], :]`` indexes heads: the sequence dim goes through; an index
    over the sequence dim (a token gather) mixes tokens."""
    from streamfx.passes.seq_dims import TOKEN_LOCAL, UNKNOWN_MIXING

    aten = torch.ops.aten
    x = torch.randn(2, 6, 6, 6)  # [B, T, heads, head_dim]: every size equal but B
    idx = torch.tensor([-2])
    gm, sd = _analyse(lambda x: x[..., idx, :] * 2.0, x)
    node = _by_target(gm, aten.index.Tensor)[0]
    assert sd.roles(node) == (None, "q", None, None) and sd.classify(node) == TOKEN_LOCAL
    gm, sd = _analyse(lambda x: x[:, idx] * 2.0, x)
    assert sd.classify(_by_target(gm, aten.index.Tensor)[0]) == UNKNOWN_MIXING


@pytest.mark.fast
def test_sliced_key_assembly_is_token_local():
    """MLA writes the no-rope and rope parts of each head's key into an empty tensor."""
    from streamfx.passes.seq_dims import TOKEN_LOCAL

    aten = torch.ops.aten

    def assemble(k_pass, k_rot):
        key = k_pass.new_empty(2, 3, k_pass.shape[1], 7)
        key[..., :4] = k_pass.transpose(1, 2)
        key[..., 4:] = k_rot.transpose(1, 2)
        return key * 1.0

    gm, sd = _analyse(assemble, torch.randn(2, 5, 3, 4), torch.randn(2, 5, 1, 3))
    for node in _by_target(gm, aten.slice_scatter.default):
        assert sd.roles(node) == (None, None, "q", None) and sd.classify(node) == TOKEN_LOCAL, node.format_node()


@pytest.mark.fast
@pytest.mark.expect_fallback
@pytest.mark.parametrize("part", ["forward", "backward"])
def test_a_failing_chunk_schedule_runs_the_region_whole(monkeypatch, part):
    """A streamed region that fails at run time (a chunk graph that does not run) runs whole for
    that call: exact gradients and one warning naming the region and the failure."""
    from streamfx.runtime import LayerProgram

    def broken(self, *args):
        raise RuntimeError("a chunk graph that does not run")

    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    monkeypatch.setattr(LayerProgram, part, broken)
    model, make_inputs = zoo.tiny_llama()
    run = run_eager_and_compiled(model, make_inputs("odd13"), {"chunk_size": 5})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    said = [w for w in run.warnings if "could not run chunk by chunk (RuntimeError: a chunk graph that does not run)" in w]
    assert said and all("region 'layer." in w for w in said), run.warnings


class L2NormAttention(zoo.LlamaAttention):
    """Queries and keys scaled to unit length (``x / x.norm(dim=-1).clamp_min(eps)``, as ZAYA
    and other qk-normalised models do)."""

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q = q / q.norm(p=2, dim=-1, keepdim=True).clamp_min(1e-6)
        k = k / k.norm(p=2, dim=-1, keepdim=True).clamp_min(1e-6)
        rep = self.n_head // self.n_kv
        y = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


@pytest.mark.parametrize("codegen", [pytest.param("eager", marks=pytest.mark.fast),
                                     pytest.param("inductor", marks=pytest.mark.slow)])
def test_norm_of_a_zero_vector_has_a_zero_gradient(codegen):
    """Padding tokens embed to zero vectors (``padding_idx``), so their queries and keys are zero:
    the norm's own derivative there is 0, its decomposition's (sqrt of a sum of squares) nan.
    The joint keeps the norm whole, so every chunk graph differentiates the norm itself."""
    torch.manual_seed(0)
    model = zoo.TinyLlama().float().train()
    model.embed = torch.nn.Embedding(zoo.VOCAB, zoo.HIDDEN, padding_idx=zoo.PAD_ID)
    for block in model.layers:
        old = block.attn
        block.attn = L2NormAttention(zoo.HIDDEN, zoo.HEADS, zoo.KV_HEADS, zoo.HEAD_DIM)
        block.attn.load_state_dict(old.state_dict())
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13, pad="left", n_pad=4))
    assert (inputs.args[0] == zoo.PAD_ID).any()
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 4, "codegen": codegen})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert {p.name for p in run.programs} >= {"layer.0", "layer.1", "head"}, (run.programs, run.warnings)


class ShortConv(torch.nn.Module):
    """A causal depthwise convolution over the sequence in place of attention (LFM2's short
    convolutions, the convolution of a Mamba block)."""

    def __init__(self, d, kernel=3):
        super().__init__()
        self.conv = torch.nn.Conv1d(d, d, kernel, groups=d, padding=kernel - 1)

    def forward(self, x, cos, sin):
        return self.conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)


class RunningMean(torch.nn.Module):
    """A mean over each token and the tokens before it in place of attention (a prefix sum: a
    recurrence, causal but no attention, no convolution)."""

    def forward(self, x, cos, sin):
        counts = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)
        return x.cumsum(1) / counts[:, None]


@pytest.mark.fast
def test_hybrid_layers_without_attention_are_warned_and_the_rest_streams():
    """A hybrid model (a recurrent layer, then an attention layer): the attention layer and the
    head stream, and one warning names the recurrence as token mixing outside every attention
    layer."""
    torch.manual_seed(0)
    model = zoo.TinyLlama().float().train()
    model.layers[0].attn = RunningMean()
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert {p.name for p in run.programs} == {"layer.0", "head"}, run.warnings  # regions are named per attention
    assert len(run.warnings) == 1 and "token mixing outside every attention layer" in run.warnings[0] \
        and "aten.cumsum at" in run.warnings[0], run.warnings


@pytest.mark.fast
def test_a_short_convolution_in_place_of_attention_streams():
    """A hybrid model whose first layer mixes tokens by a causal short convolution (LFM2's
    convolution layers): that layer streams too (a chunk reads its rows and the 2 before them),
    then the attention layer and the head, exactly, with no warning."""
    torch.manual_seed(0)
    model = zoo.TinyLlama().float().train()
    model.layers[0].attn = ShortConv(zoo.HIDDEN)
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 4, "strict": True})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, run.warnings
    assert not run.warnings, run.warnings


class WithPrefixMean(torch.nn.Module):
    """A layer's MLP plus a running mean over the tokens before each (a prefix sum: causal, but
    not attention)."""

    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        seen = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[:, None]
        return self.mlp(x) + 0.1 * torch.cumsum(x, dim=1) / seen


@pytest.mark.fast
def test_a_layer_mixing_tokens_besides_its_attention_is_named_with_what_to_change():
    """A prefix sum inside one attention layer: that layer runs unstreamed (exact), the other
    layer and the head stream, and the warning names the op, its line, why and what to change;
    strict raises it."""
    torch.manual_seed(0)
    model = zoo.TinyLlama().float().train()
    model.layers[1].mlp = WithPrefixMean(model.layers[1].mlp)
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert {p.name for p in run.programs} == {"layer.0", "head"}, run.warnings
    assert len(run.warnings) == 1, run.warnings
    said = run.warnings[0]
    assert "region 'layer.1' is not streamed: unknown-mixing op inside a layer" in said, said
    assert "a prefix sum" in said and "compute the op outside the decoder layers or per token" in said, said
    assert "aten.cumsum at" in said and "torch.cumsum(x, dim=1)" in said, said
    torch._dynamo.reset()
    with pytest.raises(streamfx.StreamBPError, match=r"unknown-mixing op inside a layer.*aten\.cumsum at"):
        run_eager_and_compiled(model, inputs, {"chunk_size": 5, "strict": True})


class BlockLinearAttention(torch.nn.Module):
    """Causal linear attention computed as a block scan (Qwen3-Next's gated delta rule, Mamba-2's
    SSD): inside each block of 4 tokens, tril(Q Kᵀ) V; across blocks, a state Σ Kᵀ V carried
    forward. No softmax anywhere. ``block=None``: one product over the whole sequence, unmasked
    (bidirectional linear attention)."""

    def __init__(self, d, block=4):
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.block = block

    def forward(self, x, cos, sin):
        B, T, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if self.block is None:
            return (q @ k.transpose(1, 2) / d) @ v / T
        pad = -T % self.block
        q, k, v = (torch.nn.functional.pad(t, (0, 0, 0, pad)).view(B, -1, self.block, d) for t in (q, k, v))
        state = x.new_zeros(B, d, d)
        out = []
        for i in range(q.shape[1]):
            scores = (q[:, i] @ k[:, i].transpose(1, 2)).tril() / d
            out.append(scores @ v[:, i] + q[:, i] @ state / d)
            state = state + k[:, i].transpose(1, 2) @ v[:, i]
        return torch.stack(out, 1).view(B, -1, d)[:, :T]


@pytest.mark.fast
@pytest.mark.parametrize("block", [4, None], ids=["block-scan", "bidirectional"])
def test_linear_attention_runs_exactly_and_names_its_cause(block):
    """A layer of linear attention (scores times values, no softmax) runs unstreamed and exactly,
    and the warning says so (not "attention that is not causal"), whether it is a scan over
    blocks of the sequence or one unmasked product over the whole sequence (found as a score
    matmul with no softmax); the attention layer and the head stream."""
    torch.manual_seed(0)
    model = zoo.TinyLlama().float().train()
    model.layers[0].attn = BlockLinearAttention(zoo.HIDDEN, block)
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    streamed = {p.name for p in run.programs}  # regions are named per attention site
    assert "head" in streamed and len(streamed) == 2, (streamed, run.warnings)
    assert len(run.warnings) == 1 and "linear attention" in run.warnings[0] \
        and "test_architectures.py" in run.warnings[0], run.warnings


class PooledContext(torch.nn.Module):
    """Token mixing by a sum over the sequence that comes back onto every token (a pooled
    context, bidirectional): no attention site, no op classed as mixing by itself."""

    def __init__(self, d, seq_dim=1):
        super().__init__()
        self.proj = torch.nn.Linear(d, d, bias=False)
        self.seq_dim = seq_dim

    def forward(self, x, cos=None, sin=None):
        return self.proj(x.mean(self.seq_dim, keepdim=True)).expand_as(x)


class SequenceFirstLM(torch.nn.Module):
    """XLNet's layout: the token ids are transposed to [T, B] before the embedding, the layers
    run sequence-first, the logits are transposed back; its only token mixing is pooled."""

    def __init__(self, vocab=zoo.VOCAB, d=zoo.HIDDEN):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.mix = PooledContext(d, seq_dim=0)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx, labels):
        x = self.embed(idx.t().contiguous())
        x = x + self.mix(x)
        x = x + self.mlp(x)
        logits = self.head(x).transpose(0, 1)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)), logits


@pytest.mark.fast
@pytest.mark.parametrize("where", ["between-attention", "sequence-first"])
def test_pooled_token_mixing_is_warned(where):
    """A sum over the sequence that comes back onto the tokens mixes them: between attention
    layers it is warned as a layer without attention (the attention layer streams); in a
    sequence-first model without attention (the sequence is the ids' last axis as passed, not
    the embedding's after a transpose) it is warned as no causal attention, and the head streams
    over the sequence. Exact either way."""
    torch.manual_seed(0)
    if where == "between-attention":
        model = zoo.TinyLlama().float().train()
        model.layers[0].attn = PooledContext(zoo.HIDDEN)
        expected, streamed = "token mixing outside every attention layer", {"layer.0", "head"}
    else:
        model = SequenceFirstLM()
        expected, streamed = "no causal attention found", {"head"}
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 3, 13))
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert {p.name for p in run.programs} == streamed, run.warnings
    assert len(run.warnings) == 1 and expected in run.warnings[0] and "test_architectures.py" in run.warnings[0], run.warnings
    if where == "sequence-first":  # 13 tokens in head chunks of 4: streamed over the sequence, not the 3 rows
        assert run.counters["chunks_forward"] == 4, run.counters


@pytest.mark.parametrize("codegen", [pytest.param("eager", marks=[pytest.mark.fast, pytest.mark.heavy]), "inductor"])
def test_llama4_chunked_attention_with_left_padding(codegen):
    """Hugging Face's Llama 4 (text) from a tiny config, with chunks of 4 attention tokens over
    T=13 and the last row left-padded by 3: its chunks then start at each row's first real token
    (``create_chunked_causal_mask`` counts the padding with ``mask.cumsum(-1) == zeros_like(mask)``
    and a sum). The pattern is read at neutral data (no padding: chunked), the keys each chunk
    reads come from the mask at run time, and every layer (chunked attention, full attention
    without rotary, the MoE whose experts read every token through ``repeat``) and the head
    stream, exactly."""
    import copy
    import warnings

    import arch_configs
    from streamfx.runtime import COUNTERS

    model = arch_configs.build("llama4_text", "sdpa", attention_chunk_size=4)
    ref = copy.deepcopy(model)
    batch = arch_configs.inputs(model, B=2, T=13, seed=0, pad="left", n_pad=3)
    ref_loss = ref(**batch).loss
    ref_loss.backward()
    compiled = torch.compile(model, backend="streambp", options={"codegen": codegen, "chunk_size": 5})
    before = dict(COUNTERS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = compiled(**batch).loss
        loss.backward()
    ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
    messages = [str(w.message) for w in caught if "streamfx" in str(w.message)]
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match({n: p.grad for n, p in ref.named_parameters()},
                       {n: p.grad for n, p in model.named_parameters()}, rtol=1e-4)
    assert not messages, messages
    layers = model.config.num_hidden_layers
    assert ran["region_forward"] == layers + 1 and ran["region_backward"] == layers + 1, ran
    assert ran["chunks_backward"] >= layers * 3, ran  # T=13 in chunks of 5


class SequenceFirstLayer(torch.nn.Module):
    """A batch-first layer that computes sequence-first (as a layer written around
    ``nn.MultiheadAttention``'s default layout does) and returns its result as a transposed view:
    the layer's output, and so its region's, is not contiguous in the graph."""

    def __init__(self, d=zoo.HIDDEN, heads=zoo.HEADS):
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def forward(self, x):
        y = x.transpose(0, 1)                                   # [T, B, d]
        T, B, d = y.shape
        q, k, v = self.qkv(self.norm(y)).view(T, B, 3, self.heads, d // self.heads).permute(2, 1, 3, 0, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(2, 0, 1, 3).reshape(T, B, d)
        y = y + self.out(a)
        y = y + self.mlp(y)
        return y.transpose(0, 1)                                # [B, T, d], a view


class TransposedOutputLM(torch.nn.Module):
    def __init__(self, vocab=zoo.VOCAB, d=zoo.HIDDEN, layers=zoo.LAYERS):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList(SequenceFirstLayer(d) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx, labels):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(x)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten()), logits


@pytest.mark.parametrize("codegen", [pytest.param("eager", marks=pytest.mark.fast), "inductor"])
def test_a_layer_returning_a_transposed_view_streams(codegen):
    """A region output that is a strided view in the graph (a layer run sequence-first, its result
    transposed back) leaves the region op in one layout whichever way the op ran (chunks, or whole
    after a failure): the compiled code after it is generated for that layout. Exact, every
    layer streamed."""
    torch.manual_seed(0)
    model = TransposedOutputLM()
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 21))
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 4, "codegen": codegen,
                                                 "strict": True})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert not run.warnings, run.warnings
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, [p.name for p in run.programs]
    assert run.counters["chunks_backward"] >= 2 * 5, run.counters


class MultiheadLayer(torch.nn.Module):
    """A pre-norm layer around ``nn.MultiheadAttention`` as written by hand: a causal
    ``attn_mask`` (float -inf or boolean), an optional ``key_padding_mask`` (True where a key is
    padding: the opposite of Hugging Face's attention_mask), and ``need_weights`` at its default,
    True, under which the module computes the attention itself: ``baddbmm(mask, q, kᵀ)``, softmax,
    ``bmm``, over heads laid out as ``[T, B x H, d/H]`` and merged back as ``[T x B, d]``."""

    def __init__(self, d, heads, batch_first, need_weights):
        super().__init__()
        self.norm, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.attention = torch.nn.MultiheadAttention(d, heads, batch_first=batch_first)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))
        self.need_weights = need_weights

    def forward(self, x, mask, padding):
        h = self.norm(x)
        x = x + self.attention(h, h, h, attn_mask=mask, key_padding_mask=padding, need_weights=self.need_weights)[0]
        return x + self.mlp(self.norm2(x))


class MultiheadLM(torch.nn.Module):
    def __init__(self, batch_first=True, need_weights=True, bool_mask=False, d=zoo.HIDDEN, layers=zoo.LAYERS):
        super().__init__()
        self.embed = torch.nn.Embedding(zoo.VOCAB, d)
        self.layers = torch.nn.ModuleList(MultiheadLayer(d, zoo.HEADS, batch_first, need_weights)
                                          for _ in range(layers))
        self.head = torch.nn.Linear(d, zoo.VOCAB)
        self.batch_first, self.bool_mask = batch_first, bool_mask

    def forward(self, idx, labels, padding=None):
        T = idx.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).triu(1)
        mask = causal if self.bool_mask else torch.zeros(T, T, device=idx.device).masked_fill(causal, float("-inf"))
        x = self.embed(idx)
        x = x if self.batch_first else x.transpose(0, 1)
        for layer in self.layers:
            x = layer(x, mask, padding)
        x = x if self.batch_first else x.transpose(0, 1)
        return F.cross_entropy(self.head(x)[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


@pytest.mark.fast
@pytest.mark.heavy
@pytest.mark.parametrize("form", ["batch_first", "sequence_first", "key_padding", "sdpa_key_padding"])
def test_multihead_attention_streams_at_every_length(form):
    """``nn.MultiheadAttention`` in its forms, at three lengths and batch sizes in one compile
    (the later ones symbolic): every layer and the head stream, exact. Its own attention
    (need_weights=True) splits the hidden size into heads merged with the batch and merges the
    sequence with the batch after it; its mask is added by the product of queries and keys
    (``baddbmm``); its key_padding_mask means padding by True, so the mask is read with every token
    present where it hides the fewest keys."""
    model = MultiheadLM(batch_first=form != "sequence_first", need_weights=form != "sdpa_key_padding",
                        bool_mask=form in ("key_padding", "sdpa_key_padding"))

    def batch(B, T):
        idx = torch.randint(0, zoo.VOCAB, (B, T), generator=torch.Generator().manual_seed(B * 100 + T))
        labels, padding = idx.clone(), None
        if "key_padding" in form:
            padding = torch.zeros(B, T, dtype=torch.bool)
            padding[-1, T - 3:] = True
            labels[-1, T - 3:] = -100
        return idx, labels, padding

    assert_streams_at_every_length(model, batch)


def assert_streams_at_every_length(model, batch):
    """One strict compile of a two-layer LM with a shifted loss over (B, T) = (2, 16), (3, 12),
    (2, 21) (the later ones symbolic), ``batch(B, T)`` its arguments: losses and gradients equal
    eager's, every layer streams in chunks of 4 and the head over the T - 1 positions its shifted
    loss reads."""
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="streambp",
                             options={"codegen": "eager", "chunk_size": 4, "head_chunk_size": 4, "strict": True})
    for B, T in [(2, 16), (3, 12), (2, 21)]:
        args = batch(B, T)
        for m in (ref, model):
            m.zero_grad(set_to_none=True)
        ref_loss = ref(*args)
        ref_loss.backward()
        with record_schedules() as schedules:
            loss = compiled(*args)
            loss.backward()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        assert_grads_match({n: p.grad for n, p in ref.named_parameters()},
                           {n: p.grad for n, p in model.named_parameters()}, rtol=1e-4)
        chunks = -(-T // 4)
        assert {k: set(v) for k, v in schedules.items()} == {"layer.0": {chunks}, "layer.1": {chunks},
                                                           "head": {-(-(T - 1) // 4)}}, (B, T, dict(schedules))


class EinsumAttention(torch.nn.Module):
    """Attention written with ``torch.einsum`` (as many research codebases write it), in the
    layout ``form`` names: "tokens_first" (``[B, T, H, d]`` throughout, a causal buffer sliced to
    T), "scores_tokens_first" (the same, its scores ``[B, T, H, T]``: the causal mask ``[T, 1, T]``),
    "heads_first" (``[B, H, T, d]``), "seq_first" (``[T, B, H, d]``); a padding mask added to
    the scores. Between its products einsum's decomposition adds a dim of one element after the
    keys (``[B, H, T, T, 1]``)."""

    def __init__(self, form, d=zoo.HIDDEN, heads=zoo.HEADS):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.form, self.heads = form, heads
        self.register_buffer("tril", torch.tril(torch.ones(64, 64)), persistent=False)

    def forward(self, x, padding):
        B, T, D = x.shape
        q, k, v = (t.view(B, T, self.heads, -1) for t in self.qkv(x).split(D, -1))
        hidden = (1.0 - padding.float()) * -1e9   # (padding: 1 where a token is present)
        scale = (D // self.heads) ** -0.5
        if self.form == "tokens_first":
            s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
            s = s.masked_fill(self.tril[:T, :T] == 0, float("-inf")) + hidden[:, None, None, :]
            a = torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)
        elif self.form == "scores_tokens_first":
            s = torch.einsum("bqhd,bkhd->bqhk", q, k) * scale
            s = s.masked_fill(self.tril[:T, None, :T] == 0, float("-inf")) + hidden[:, None, None, :]
            a = torch.einsum("bqhk,bkhd->bqhd", s.softmax(-1), v)
        else:
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            if self.form == "heads_first":
                q, k, v = (t.transpose(1, 2) for t in (q, k, v))
                s = torch.einsum("bhqd,bhkd->bhqk", q, k) * scale
                p = (s.masked_fill(~causal, float("-inf")) + hidden[:, None, None, :]).softmax(-1)
                a = torch.einsum("bhqk,bhkd->bhqd", p, v).transpose(1, 2)
            else:
                q, k, v = (t.transpose(0, 1) for t in (q, k, v))
                s = torch.einsum("qbhd,kbhd->bhqk", q, k) * scale
                p = (s.masked_fill(~causal, float("-inf")) + hidden[:, None, None, :]).softmax(-1)
                a = torch.einsum("bhqk,kbhd->bqhd", p, v)
        return self.out(a.reshape(B, T, D))


class EinsumLM(torch.nn.Module):
    def __init__(self, form, d=zoo.HIDDEN, layers=zoo.LAYERS):
        super().__init__()
        self.embed = torch.nn.Embedding(zoo.VOCAB, d)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(d) for _ in range(layers))
        self.attention = torch.nn.ModuleList(EinsumAttention(form, d) for _ in range(layers))
        self.mlps = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.LayerNorm(d), torch.nn.Linear(d, 2 * d),
                                                            torch.nn.GELU(), torch.nn.Linear(2 * d, d))
                                        for _ in range(layers))
        self.head = torch.nn.Linear(d, zoo.VOCAB)

    def forward(self, idx, padding, labels):
        x = self.embed(idx)
        for norm, attention, mlp in zip(self.norms, self.attention, self.mlps):
            x = x + attention(norm(x), padding)
            x = x + mlp(x)
        return F.cross_entropy(self.head(x)[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)


@pytest.mark.parametrize("form", [pytest.param("heads_first", marks=pytest.mark.fast), "tokens_first", "seq_first",
                                  "scores_tokens_first"])
def test_einsum_attention_streams_at_every_length(form):
    """Attention written with ``torch.einsum`` in four layouts, with right padding, at three
    lengths and batch sizes in one compile (the later ones symbolic): every layer and the head
    stream, exact (strict). Its scores reach the softmax through a dim of one element after the
    keys, which the attention's walk from Q·Kᵀ to the product with V passes."""
    torch.manual_seed(0)
    assert_streams_at_every_length(
        EinsumLM(form), lambda B, T: zoo.tokens(zoo.Case("einsum", B, T, pad="right", seed=B * 100 + T)))


class GroupedEinsumAttention(torch.nn.Module):
    """Grouped-query attention written with one ``torch.einsum`` over query groups (``[B, T, G, R,
    d]`` queries, ``[B, T, G, d]`` keys and values: each of the G key/value heads serves R query
    heads, with no repeat of the keys). Einsum lays its products out as ``[B x G, R x T, d]``
    ("grq", scores ``[B, G, R, T, T]``) or ``[B x G, T x R, d]`` ("gqr", scores ``[B, G, T, R, T]``,
    a causal mask ``[T, 1, T]`` and the padding added after it; ``window`` keys: a sliding window;
    ``"future"``: each query sees its own and later keys), or ``[B x G, R x T, d]`` with the groups
    first ("rgq", scores ``[R, B, G, T, T]``): the queries share one dim of the products with
    other axes, on either side of them."""

    def __init__(self, form, d=zoo.HIDDEN, heads=zoo.HEADS, groups=2, window=None):
        super().__init__()
        self.d_head, self.heads, self.groups, self.form, self.window = d // heads, heads, groups, form, window
        self.q, self.kv = torch.nn.Linear(d, d), torch.nn.Linear(d, 2 * groups * (d // heads))
        self.out = torch.nn.Linear(d, d)

    def forward(self, x, padding):
        B, T, D = x.shape
        G, R = self.groups, self.heads // self.groups
        q = self.q(x).view(B, T, G, R, self.d_head) * self.d_head ** -0.5
        k, v = self.kv(x).view(B, T, 2, G, self.d_head).unbind(2)
        ones = torch.ones(T, T, dtype=torch.bool, device=x.device)
        allowed = ones.triu() if self.window == "future" else ones.tril()
        if isinstance(self.window, int):
            allowed = allowed & ones.triu(1 - self.window)
        hidden = (1.0 - padding.float()) * -1e9   # (padding: 1 where a token is present)
        if self.form == "grq":
            s = torch.einsum("bqgrd,bkgd->bgrqk", q, k).masked_fill(~allowed, float("-inf"))
            a = torch.einsum("bgrqk,bkgd->bqgrd", (s + hidden[:, None, None, None, :]).softmax(-1), v)
        elif self.form == "gqr":
            s = torch.einsum("bqgrd,bkgd->bgqrk", q, k).masked_fill(~allowed[:, None, :], float("-inf"))
            a = torch.einsum("bgqrk,bkgd->bqgrd", (s + hidden[:, None, None, None, :]).softmax(-1), v)
        else:
            s = torch.einsum("bqgrd,bkgd->rbgqk", q, k).masked_fill(~allowed, float("-inf"))
            a = torch.einsum("rbgqk,bkgd->bqgrd", (s + hidden[None, :, None, None, :]).softmax(-1), v)
        return self.out(a.reshape(B, T, D))


def grouped_einsum_lm(form, window=None):
    torch.manual_seed(0)
    model = EinsumLM("heads_first")
    model.attention = torch.nn.ModuleList(GroupedEinsumAttention(form, window=window) for _ in model.attention)
    return model


@pytest.mark.parametrize("form,window", [pytest.param("gqr", None, marks=pytest.mark.fast), ("grq", None),
                                         pytest.param("rgq", None, marks=pytest.mark.extended), ("gqr", 3)],
                         ids=["gqr", "grq", "rgq", "gqr-window3"])
def test_grouped_einsum_attention_streams_at_every_length(form, window):
    """Grouped-query attention in one einsum, its queries merged with their group's heads in one
    dim of the products (before or after them), under a causal or sliding-window mask whose query
    dim is not the scores' second to last (``[B, G, T, R, T]``), with right padding, at three
    lengths in one compile: every layer and the head stream, exact (strict)."""
    assert_streams_at_every_length(
        grouped_einsum_lm(form, window), lambda B, T: zoo.tokens(zoo.Case("gqa", B, T, pad="right", seed=B * 10 + T)))


@pytest.mark.fast
def test_grouped_einsum_attention_that_sees_later_keys_is_refused():
    """The same layout under a mask that lets each query see its own and the later keys (read in
    the scores' own dims, ``[T, 1, T]`` against ``[B, G, T, R, T]``): not causal, so the layers
    run whole with that cause, exact; the report's sequence length is the tokens' (12), not the
    merged queries' (T x R) nor the shifted head's (T - 1)."""
    model = grouped_einsum_lm("gqr", "future")
    case = zoo.Case("gqa", 2, 12, pad="right", seed=7)
    args = zoo.tokens(case)
    report = streamfx.explain(model, *args, options={"codegen": "eager", "chunk_size": 4})
    assert [name for name, _ in report.not_streamed] == ["layer.0", "layer.1"], report.not_streamed
    assert all("attention that is not causal" in why for _, why in report.not_streamed), report.not_streamed
    assert list(report.seq_dim) == [12], report.seq_dim
    inputs = zoo.Inputs(args, {}, case, lambda loss: loss, lambda loss: None, zoo.VOCAB)
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 4})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert not run.programs_named("layer.0") and run.programs_named("head")


class PrefixLM(torch.nn.Module):
    """Attention under a mask built from a per-token flag whose 0 opens a bidirectional prefix
    (a prefix-LM's, as multimodal models mark image tokens): causal where every flag is 1."""

    def __init__(self, d=zoo.HIDDEN, layers=zoo.LAYERS):
        super().__init__()
        self.embed = torch.nn.Embedding(zoo.VOCAB, d)
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d, 3 * d) for _ in range(layers))
        self.out = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(layers))
        self.head = torch.nn.Linear(d, zoo.VOCAB)

    def forward(self, idx, flags, labels):
        B, T = idx.shape
        i = torch.arange(T, device=idx.device)
        allowed = (i[None, :, None] >= i[None, None, :]) | ((flags[:, :, None] == 0) & (flags[:, None, :] == 0))
        x = self.embed(idx)
        for qkv, out in zip(self.qkv, self.out):
            q, k, v = qkv(x).view(B, T, 3, zoo.HEADS, -1).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
            x = x + out(a.transpose(1, 2).reshape(B, T, -1))
        return F.cross_entropy(self.head(x).flatten(0, 1), labels.flatten()), None


@pytest.mark.fast
def test_a_flag_whose_zero_opens_a_bidirectional_prefix_keeps_the_causal_reading():
    """The mask's pattern is read with every flag at 1 (causal) rather than at the value that
    hides fewest keys (0: every key of a whole-prefix row), since that one lets queries see later
    keys; the prefix's later keys are read per call. Every layer streams, exact."""
    torch.manual_seed(0)
    model = PrefixLM()
    idx = torch.randint(0, zoo.VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    flags = torch.ones(2, 16, dtype=torch.long)
    flags[0, :5], flags[1, :9] = 0, 0
    inputs = zoo.Inputs((idx, flags, idx), {}, zoo.Case("prefix", 2, 16), lambda o: o[0], lambda o: o[1], zoo.VOCAB)
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 4, "strict": True})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert {p.name for p in run.programs} >= {"layer.0", "layer.1"}, [p.name for p in run.programs]
    assert set(run.schedules["layer.0"]) == {4}, run.schedules


@pytest.mark.fast
@pytest.mark.parametrize("extra", ["add_bias_kv", "add_zero_attn"])
def test_multihead_attention_with_a_key_beside_the_sequence_says_it_is_not_causal(extra):
    """``add_bias_kv`` / ``add_zero_attn`` append a key after the sequence that every query reads:
    not causal. The layers run whole, exact, and say so (strict=True raises)."""

    class Appended(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(zoo.VOCAB, zoo.HIDDEN)
            self.attention = torch.nn.MultiheadAttention(zoo.HIDDEN, zoo.HEADS, batch_first=True, **{extra: True})
            self.head = torch.nn.Linear(zoo.HIDDEN, zoo.VOCAB)

        def forward(self, idx, labels):
            T = idx.shape[1]
            x = self.embed(idx)
            x = x + self.attention(x, x, x, attn_mask=torch.ones(T, T, dtype=torch.bool).triu(1),
                                   need_weights=False)[0]
            return F.cross_entropy(self.head(x).flatten(0, 1), labels.flatten()), None

    torch.manual_seed(0)
    model = Appended()
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 12))
    with pytest.raises(streamfx.StreamBPError, match="not causal"):
        torch.compile(copy.deepcopy(model), backend="streambp",
                      options={"codegen": "eager", "strict": True})(*inputs.args)
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 4})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert "layer.0" not in {p.name for p in run.programs}, run.programs
    assert any("not causal" in w for w in run.warnings), run.warnings


@pytest.mark.fast
def test_gpt2_reordered_upcast_attention_streams():
    """GPT-2 with ``reorder_and_upcast_attn`` (and its per-layer score scaling): the product of
    queries and keys is written by ``baddbmm(empty, q, kᵀ, beta=0)``, whose uninitialised input
    it ignores, so the mask is the causal ``where`` after it alone. Every layer streams, exact."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=zoo.VOCAB, n_embd=zoo.HIDDEN, n_layer=zoo.LAYERS, n_head=zoo.HEADS,
                     n_positions=zoo.MAX_POS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     pad_token_id=zoo.PAD_ID, reorder_and_upcast_attn=True, scale_attn_by_inverse_layer_idx=True)
    model = zoo._hf(GPT2LMHeadModel, cfg, "eager")
    inputs = zoo._hf_inputs(zoo.VOCAB)("right_pad")
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 4, "head_chunk_size": 4, "strict": True})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, [p.name for p in run.programs]
    assert set(run.schedules["layer.0"]) == {4}, run.schedules


class SideInputs(zoo.TinyLlama):
    """TinyLlama whose layers also read tensors computed from the token embedding before them,
    each layer its own slice (``form="per_layer"``: Gemma 4's per-layer embeddings, a projection
    of the embedding to [B, T, layers, p] gating each layer's output) or all the same one
    (``form="x0"``: the first hidden state mixed into every layer's input with learned weights, as
    value-residual and modded-nanogpt models do). The per-layer path reaches each later layer after
    its attention, around the earlier layers' outputs; the first hidden state joins each layer's
    input before its attention. ``form="carried"``: a per-token state each layer hands the next
    beside the residual stream, made from the layer's output and added to the state before it
    (Zaya's router states), gating what the layer adds: it reaches every later layer around the
    earlier layers' outputs."""

    def __init__(self, form, p=8):
        super().__init__(n_layer=3)
        self.form = form
        n, d = len(self.layers), self.embed.embedding_dim
        self.side = torch.nn.Linear(d, n * p, bias=False)
        self.gates = torch.nn.ModuleList(torch.nn.Linear(d, p, bias=False) for _ in range(n))
        self.outs = torch.nn.ModuleList(torch.nn.Linear(p, d, bias=False) for _ in range(n))
        self.mix = torch.nn.Parameter(torch.tensor([[0.7, 0.3]] * n))

    def forward(self, idx, labels=None):
        B, T = idx.shape
        cos, sin = self.cos[:T], self.sin[:T]
        x = x0 = self.embed(idx)
        side = self.side(x0).view(B, T, len(self.layers), -1) * 0.5
        state = None
        for i, layer in enumerate(self.layers):
            if self.form == "x0":
                x = self.mix[i, 0] * x + self.mix[i, 1] * x0
            x = layer(x, cos, sin)
            if self.form == "carried":
                state = self.gates[i](x) + (0.5 * state if state is not None else 0)
                x = x + self.outs[i](F.gelu(state))
            if self.form == "per_layer":
                x = x + self.outs[i](F.gelu(self.gates[i](x)) * side[:, :, i])
        logits = self.lm_head(self.norm(x))
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        return F.cross_entropy(logits.reshape(-1, self.vocab), shifted.reshape(-1), ignore_index=-100), logits


@pytest.mark.parametrize("form", [pytest.param("per_layer", marks=pytest.mark.fast), "x0",
                                  pytest.param("carried", marks=[pytest.mark.fast, pytest.mark.heavy])])
def test_layers_reading_tensors_made_from_the_embedding_stream(form):
    """Tensors computed from the token embedding before the layers and read inside every layer
    (per-layer embeddings, the first hidden state), or handed from layer to layer beside the
    residual stream, are side inputs of each layer: every layer streams, at its own boundaries,
    with the gradients of eager autograd."""
    torch.manual_seed(0)
    model = SideInputs(form).float().train()
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    run = run_eager_and_compiled(model, inputs, {"codegen": "eager", "chunk_size": 5, "head_chunk_size": 4})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert not run.warnings, run.warnings
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "layer.2", "head"}, run.warnings
    for p in run.programs:   # (each layer region holds its own attention, not its neighbour's)
        if p.name.startswith("layer"):
            assert run.schedules[p.name] and set(run.schedules[p.name]) == {3}, run.schedules


@pytest.mark.parametrize("family", ["gemma4_text", "mimo_v2_flash", "zaya", "doge", "granite_swa"])
def test_hf_families_stream_every_layer(monkeypatch, family):
    """Hugging Face families (tiny configs of the installed transformers) whose every layer and
    head stream under the user's contract (verification off), with eager autograd's loss and
    gradients: Gemma 4 (per-layer embeddings read in every layer; sliding and full attention
    layers), MiMo-V2-Flash (eager attention that subtracts the scores' row maximum,
    ``max(-1).values``, before its softmax, in its layers without sinks), Zaya (queries and keys
    convolved together before the attention, values delayed by a token), Doge (a bias per key made
    from the values, its dynamic mask: the K/V graph makes it), GraniteSWA (its output scaled by a
    sink against the log-sum-exp of the masked scores, read per row after the attention)."""
    import arch_configs
    import arch_sweep

    if family not in {m for m, _, _ in arch_configs.causal_lm_classes()}:
        pytest.skip(f"the installed transformers has no {family}")
    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    result = arch_sweep.check(family)
    assert result["status"] == "ok" and result["error"] is None and not result["warnings"], result
    assert set(result["streamed"]) == {*(f"layer.{i}" for i in range(result["layers"])), "head"}, result
    assert result["loss_err"] <= 1e-5 and result["grad_err"] <= 1e-4, result


def test_a_recurrent_depth_model_streams_every_call_of_its_layers(monkeypatch):
    """Dory (Hugging Face, tiny config): an input layer, two recurrent layers run twice per step
    with one set of weights, an output layer. Every call of a layer is a region of its own that
    streams (six), with eager autograd's loss and gradients, the recurrent layers' weights getting
    the sum of both calls' gradients. (Under SDPA with left padding eager autograd's own gradients
    are NaN, a fully masked row's: the check runs it with eager attention.)"""
    import arch_configs
    import arch_sweep

    if "dory" not in {m for m, _, _ in arch_configs.causal_lm_classes()}:
        pytest.skip("the installed transformers has no dory")
    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    result = arch_sweep.check("dory")
    assert result["status"] == "ok" and result["error"] is None and not result["warnings"], result
    calls = 1 + 2 * 2 + 1
    assert result["layers"] == 4 and sorted(result["streamed"]) == ["head", *(f"layer.{i}" for i in range(calls))], \
        result
    assert result["loss_err"] <= 1e-5 and result["grad_err"] <= 1e-4, result


def test_a_token_shift_outside_attention_is_refused_in_the_terms_of_the_chunk(monkeypatch):
    """RWKV: its layers have no causal attention; the time-mixing recurrence is refused at its op,
    and the feed-forward's token shift (``ZeroPad2d((0, 0, 1, -1))``), whose output reads the row
    before each chunk, fails to instantiate per chunk: the warning names the sizes that disagree as
    the chunk's rows and the rows before its end (not the check's own symbols alone), says what the
    layer does there and what to change, at the line that adds the shifted rows. Exact, every
    refused layer warned."""
    import arch_configs
    import arch_sweep

    if "rwkv" not in {m for m, _, _ in arch_configs.causal_lm_classes()}:
        pytest.skip("the installed transformers has no rwkv")
    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    result = arch_sweep.check("rwkv")
    assert result["status"] == "ok" and result["error"] is None and not result["silent"], result
    assert result["loss_err"] <= 1e-5 and result["grad_err"] <= 1e-4, result
    shift = [w for w in result["warnings"] if "does not instantiate per chunk" in w]
    assert len(shift) == 1, result["warnings"]
    assert re.search(r"\(s\d+: the rows up to the chunk's end\)", shift[0]) \
        and re.search(r"\(s\d+: the chunk's rows\)", shift[0]), shift[0]
    assert "the layer mixes positions outside its causal attention" in shift[0] \
        and "compute that mixing outside the decoder layers or per token" in shift[0], shift[0]
    assert "modeling_rwkv.py" in shift[0] and "shifted" in shift[0], shift[0]


def test_hy_v4_layer_that_reuses_the_previous_layers_key_selection_streams(monkeypatch):
    """HY-V4: hyper-connection streams (the layer's input and output are N residual streams,
    mixed by weights split from one projection: one part read before the attention, one after)
    and DeepSeek sparse attention whose top-k key selection a "shared" layer reuses from the layer
    before it, handed beside the residual streams. Its layers start where the streams and the
    selection meet; the shared layer streams (its mask, scattered from the selection, is read per
    call), as does the head, which reads 0-dim items of a parameter (``scale.unbind(0)``): eager
    autograd's loss and gradients. The layers that compute their own selection (``topk`` over
    the keys) stay unstreamed with that cause."""
    import arch_configs
    import arch_sweep

    if "hy_v4" not in {m for m, _, _ in arch_configs.causal_lm_classes()}:
        pytest.skip("the installed transformers has no hy_v4")
    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    result = arch_sweep.check("hy_v4")
    assert result["status"] == "ok" and result["error"] is None, result
    assert set(result["streamed"]) == {"layer.2", "head"}, result
    assert all("aten.topk" in w for w in result["warnings"]), result["warnings"]
    assert result["loss_err"] <= 1e-5 and result["grad_err"] <= 1e-4, result


def test_router_noise_drawn_flat_is_read_per_token(monkeypatch):
    """Phi-3.5-MoE's router draws its Gumbel and Heun noise flat, ``[B*T, E]`` (``exponential_``,
    ``rand_like`` on the flattened tokens' scores): broadcasting with the scores makes its rows the
    tokens', and each chunk reads its rows of every batch row as one ``[B*c, E]`` block
    (``Spec.chunk(d, "inner")``). With B=2 every layer and the head stream, exactly."""
    import arch_configs
    import arch_sweep

    if "phimoe" not in {m for m, _, _ in arch_configs.causal_lm_classes()}:
        pytest.skip("the installed transformers has no phimoe")
    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    result = arch_sweep.check("phimoe")
    assert result["status"] == "ok" and result["error"] is None and not result["warnings"], result
    assert set(result["streamed"]) == {*(f"layer.{i}" for i in range(result["layers"])), "head"}, result
    assert result["loss_err"] <= 1e-5 and result["grad_err"] <= 1e-4, result


class TorchEncoderLM(torch.nn.Module):
    """A causal LM of ``torch.nn.TransformerEncoder`` layers as torch's tutorials write it:
    ``is_causal=True``, a causal mask (boolean, True where a key is hidden, or float from
    ``nn.Transformer.generate_square_subsequent_mask``) and a boolean ``src_key_padding_mask`` (True
    where a key is padding); or, unwrapped, the layers called one by one, sequence-first,
    pre-norm, under a boolean mask."""

    def __init__(self, wrapped: bool, float_mask: bool = False, d=zoo.HIDDEN, layers=zoo.LAYERS):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(d, zoo.HEADS, 2 * d, dropout=0.0, batch_first=wrapped,
                                                 norm_first=not wrapped, activation="gelu" if wrapped else "relu")
        self.embed = torch.nn.Embedding(zoo.VOCAB, d)
        if wrapped:
            self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        else:
            self.layers = torch.nn.ModuleList(copy.deepcopy(layer) for _ in range(layers))
        self.head = torch.nn.Linear(d, zoo.VOCAB)
        self.wrapped, self.float_mask = wrapped, float_mask

    def forward(self, idx, labels, padding=None):
        T = idx.shape[1]
        x = self.embed(idx)
        if self.float_mask:
            mask = torch.nn.Transformer.generate_square_subsequent_mask(T, device=idx.device)
        else:
            mask = torch.ones(T, T, dtype=torch.bool, device=idx.device).triu(1)
        if self.wrapped:
            x = self.encoder(x, mask=mask, src_key_padding_mask=padding, is_causal=True)
        else:
            x = x.transpose(0, 1)
            for layer in self.layers:
                x = layer(x, src_mask=mask, src_key_padding_mask=padding)
            x = x.transpose(0, 1)
        return F.cross_entropy(self.head(x).flatten(0, 1), labels.flatten(), ignore_index=-100), None


def _encoder_inputs(B, T):
    idx = torch.randint(0, zoo.VOCAB, (B, T), generator=torch.Generator().manual_seed(B * 100 + T))
    labels, padding = idx.clone(), torch.zeros(B, T, dtype=torch.bool)
    padding[-1, T - 3:] = True
    labels[-1, T - 3:] = -100
    return zoo.Inputs((idx, labels, padding), {}, zoo.Case("encoder", B, T), lambda o: o[0], lambda o: o[1],
                      zoo.VOCAB)


@pytest.mark.fast
@pytest.mark.parametrize("wrapped", [True, False], ids=["encoder", "layers"])
def test_torch_transformer_encoder_layers_stream(wrapped):
    """``nn.TransformerEncoderLayer`` (torch's own; in training mode its attention is
    ``nn.MultiheadAttention``'s, under a causal mask and a padding mask) streams every layer and
    the head, exact, wrapped in ``nn.TransformerEncoder`` or called layer by layer."""
    torch.manual_seed(0)
    run = run_eager_and_compiled(TorchEncoderLM(wrapped), _encoder_inputs(2, 16),
                                 {"chunk_size": 4, "head_chunk_size": 4, "strict": True})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert {k: set(v) for k, v in run.schedules.items()} == {"layer.0": {4}, "layer.1": {4}, "head": {4}}, \
        run.schedules
    assert not run.warnings, run.warnings


@pytest.mark.fast
def test_a_break_inside_a_torch_module_says_the_module_runs_eagerly():
    """Given a float causal mask and a boolean padding mask, ``nn.TransformerEncoder``'s forward
    warns (mixed mask types are deprecated) and Dynamo breaks the graph there: the graph ends
    before the encoder's call, which runs eagerly with nothing inside it compiled (Dynamo compiles
    no ``torch.nn`` function as a frame of its own), so no layer reaches the backend. streamfx
    names the call, the break, the module that runs unstreamed and what to change, once;
    ``strict=True`` raises. Exact either way."""
    torch.manual_seed(0)
    run = run_eager_and_compiled(TorchEncoderLM(True, float_mask=True), _encoder_inputs(2, 16), {"chunk_size": 4})
    assert_grads_match(run.ref_grads, run.grads)
    assert set(run.schedules) == {"head"}, run.schedules
    assert len(run.warnings) == 1, run.warnings
    assert "Dynamo runs the call at" in run.warnings[0] and "test_architectures.py" in run.warnings[0] \
        and "transformer.py" in run.warnings[0] and "give both as booleans" in run.warnings[0], run.warnings
    torch._dynamo.reset()
    with pytest.raises(streamfx.StreamBPError, match=r"Dynamo runs the call at .*strict=True"):
        run_eager_and_compiled(TorchEncoderLM(True, float_mask=True), _encoder_inputs(2, 16),
                               {"chunk_size": 4, "strict": True})


class MetaLlamaAttention(torch.nn.Module):
    """Attention as Meta's Llama reference code writes it: rotary embeddings as complex products
    (``torch.polar`` frequencies sliced to the length, ``view_as_complex`` pairs), keys and values
    repeated per query group by ``expand`` + ``reshape``, scores plus a mask made by ``triu`` of a
    -inf matrix beside ``start_pos`` zero columns (``hstack``), softmax in fp32."""

    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.wq = torch.nn.Linear(d, d, bias=False)
        self.wk = torch.nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wv = torch.nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wo = torch.nn.Linear(d, d, bias=False)

    def forward(self, x, freqs_cis, mask):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.heads, self.hd)
        k = self.wk(x).view(B, T, self.kv_heads, self.hd)
        v = self.wv(x).view(B, T, self.kv_heads, self.hd)
        q_, k_ = (torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2)) for t in (q, k))
        f = freqs_cis.view(1, T, 1, -1)
        q, k = torch.view_as_real(q_ * f).flatten(3).type_as(q), torch.view_as_real(k_ * f).flatten(3).type_as(k)
        rep = self.heads // self.kv_heads
        k, v = (t[:, :, :, None, :].expand(B, T, self.kv_heads, rep, self.hd).reshape(B, T, self.heads, self.hd)
                for t in (k, v))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)) / self.hd ** 0.5 + mask
        out = torch.matmul(F.softmax(scores.float(), dim=-1).type_as(q), v)
        return self.wo(out.transpose(1, 2).contiguous().view(B, T, -1))


class MetaLlama(torch.nn.Module):
    def __init__(self, d=zoo.HIDDEN, layers=zoo.LAYERS, max_len=64):
        super().__init__()
        self.embed = torch.nn.Embedding(zoo.VOCAB, d)
        self.attention = torch.nn.ModuleList(MetaLlamaAttention(d, zoo.HEADS, zoo.HEADS // 2) for _ in range(layers))
        self.mlp = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.SiLU(),
                                                           torch.nn.Linear(2 * d, d)) for _ in range(layers))
        self.norms = torch.nn.ModuleList(torch.nn.RMSNorm(d) for _ in range(2 * layers + 1))
        self.output = torch.nn.Linear(d, zoo.VOCAB, bias=False)
        hd = d // zoo.HEADS
        freqs = 1.0 / (10000.0 ** (torch.arange(0, hd, 2)[: hd // 2].float() / hd))
        angles = torch.outer(torch.arange(max_len), freqs).float()
        self.freqs_cis = torch.polar(torch.ones_like(angles), angles)

    def forward(self, tokens, targets, start_pos=0):
        T = tokens.shape[1]
        h = self.embed(tokens)
        freqs_cis = self.freqs_cis.to(h.device)[start_pos:start_pos + T]
        mask = torch.triu(torch.full((T, T), float("-inf"), device=tokens.device), diagonal=1)
        mask = torch.hstack([torch.zeros((T, start_pos), device=tokens.device), mask]).type_as(h)
        for i, (attention, mlp) in enumerate(zip(self.attention, self.mlp)):
            h = h + attention(self.norms[2 * i](h), freqs_cis, mask)
            h = h + mlp(self.norms[2 * i + 1](h))
        logits = self.output(self.norms[-1](h)).float()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1), None


@pytest.mark.fast
@pytest.mark.heavy
def test_meta_llama_reference_attention_streams():
    """Meta's Llama reference form (complex rotary embeddings, grouped keys and values repeated
    by expand + reshape, an ``hstack``-ed additive mask, the targets shifted by the caller with
    -1 ignored) streams every layer and the head at lengths and batch sizes that change, exact."""
    torch.manual_seed(0)
    model = MetaLlama()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="streambp",
                             options={"codegen": "eager", "chunk_size": 4, "head_chunk_size": 4, "strict": True})
    for B, T in [(2, 16), (3, 13)]:
        tokens = torch.randint(0, zoo.VOCAB, (B, T), generator=torch.Generator().manual_seed(B * 100 + T))
        targets = tokens.roll(-1, 1)
        targets[:, -1] = -1
        for m in (ref, model):
            m.zero_grad(set_to_none=True)
        ref_loss = ref(tokens, targets)[0]
        ref_loss.backward()
        with record_schedules() as schedules:
            loss = compiled(tokens, targets)[0]
            loss.backward()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        assert_grads_match({n: p.grad for n, p in ref.named_parameters()},
                           {n: p.grad for n, p in model.named_parameters()}, rtol=1e-4)
        chunks = -(-T // 4)
        assert {k: set(v) for k, v in schedules.items()} == {"layer.0": {chunks}, "layer.1": {chunks},
                                                           "head": {chunks}}, (B, T, dict(schedules))
