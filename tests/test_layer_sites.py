"""Layer forms beyond one attention call with one mask: every layer streams, exactly.

  diff        differential attention (DiffLlama): two SDPA calls per layer on one query and key,
              each with half of the values, combined with a learned lambda (shared K/V prefix)
  diff-own    two SDPA calls per layer, each with its own keys and values
  diff-eager  two matmul-softmax attentions per layer, each masked
  where       a ``where`` with a constant on a causal (boolean buffer) mask, then an additive
              padding mask (GPT-Neo's eager attention); "where-local": every other layer a
              sliding window (GPT-Neo's local layers)
  mul         a multiplicative causal mask (``s * keep + (1 - keep) * min``), then an additive
              padding mask

and a layer compiled alone whose input is a transposed view (its chunks keep that layout).
"""
import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import zoo
from conftest import assert_grads_match, grads_of, run_eager_and_compiled
from tiers import cases
from streamfx.passes.schedule import chunk_count

FORMS = ("diff", "diff-own", "diff-eager", "where", "where-local", "mul")
WINDOW = 5


class SiteAttention(nn.Module):
    def __init__(self, d, n_head, form, local=False, max_pos=zoo.MAX_POS):
        super().__init__()
        self.n_head, self.hd, self.form = n_head, d // n_head, form
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        if form.startswith("diff"):
            self.lambda_q = nn.Parameter(torch.randn(self.hd) * 0.1)
            self.lambda_k = nn.Parameter(torch.randn(self.hd) * 0.1)
        if form == "diff-own":
            self.qkv2 = nn.Linear(d, 3 * d, bias=False)
        bias = torch.tril(torch.ones(max_pos, max_pos, dtype=torch.bool)).view(1, 1, max_pos, max_pos)
        if local:  # GPT-Neo's local layers: keys (t - W, t]
            bias = torch.bitwise_xor(bias, torch.tril(bias, -WINDOW))
        self.register_buffer("bias", bias, persistent=False)

    def heads(self, proj, x):
        B, T, d = x.shape
        return (t.view(B, T, self.n_head, self.hd).transpose(1, 2) for t in proj(x).split(d, -1))

    def forward(self, x, mask4):
        B, T, d = x.shape
        q, k, v = self.heads(self.qkv, x)
        if self.form.startswith("diff"):
            lam = torch.exp(torch.sum(self.lambda_q * self.lambda_k))
            v1, v2 = (t.repeat(1, 2, 1, 1) for t in torch.chunk(v, 2, dim=1))  # half of the value heads each
            if self.form == "diff":
                y1 = F.scaled_dot_product_attention(q, k, v1, is_causal=True)
                y2 = F.scaled_dot_product_attention(q, k, v2, is_causal=True)
            elif self.form == "diff-own":
                q2, k2, v2 = self.heads(self.qkv2, x)
                y1 = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                y2 = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
            else:
                y1, y2 = self.eager(q, k, v1, mask4), self.eager(q, k, v2, mask4)
            y = y1 - lam * y2
        else:
            y = self.eager(q, k, v, mask4)
        return self.o(y.transpose(1, 2).reshape(B, T, d))

    def eager(self, q, k, v, mask4):
        s = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        T = q.shape[-2]
        low = torch.finfo(s.dtype).min
        if self.form == "mul":  # a multiplicative mask and its additive complement
            pos = torch.arange(T, device=q.device)
            keep = (pos[None, :] <= pos[:, None]).to(s.dtype)
            s = s * keep + (1.0 - keep) * low
        else:  # GPT-Neo: where(causal, scores, min), on a slice of a boolean buffer
            causal = self.bias[:, :, :T, :T]
            s = torch.where(causal, s, torch.tensor(low, dtype=s.dtype, device=s.device))
        s = s + mask4  # the padding mask, additive
        return torch.softmax(s, dim=-1) @ v


class SiteBlock(nn.Module):
    def __init__(self, d, n_head, form, local):
        super().__init__()
        self.n1, self.n2 = zoo.RMSNorm(d), zoo.RMSNorm(d)
        self.attn = SiteAttention(d, n_head, form, local)
        self.mlp = zoo.SwiGLU(d, 2 * d)

    def forward(self, x, mask4):
        x = x + self.attn(self.n1(x), mask4)
        return x + self.mlp(self.n2(x))


class SiteLM(nn.Module):
    """A small causal LM whose layers use one of ``FORMS``; ``forward(idx, attention_mask, labels)``
    returns ``(loss, logits)``. The additive [B, 1, T, T] mask (causal and padding, as Hugging Face
    builds it) is made once from the padding flags and read by every layer."""

    def __init__(self, form, vocab=zoo.VOCAB, d=zoo.HIDDEN, n_head=zoo.HEADS, n_layer=zoo.LAYERS):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(SiteBlock(d, n_head, form.removesuffix("-local"),
                                              local=form.endswith("-local") and i % 2 == 1)
                                    for i in range(n_layer))
        self.norm = zoo.RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, attention_mask, labels=None):
        B, T = idx.shape
        x = self.embed(idx)
        pos = torch.arange(T, device=idx.device)
        allowed = (pos[None, :] <= pos[:, None])[None, None] & attention_mask[:, None, None, :].bool()
        mask4 = torch.zeros(B, 1, T, T, dtype=x.dtype, device=x.device).masked_fill(~allowed, torch.finfo(x.dtype).min)
        for layer in self.layers:
            x = layer(x, mask4)
        logits = self.lm_head(self.norm(x))
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        loss = F.cross_entropy(logits.reshape(-1, self.vocab), shifted.reshape(-1), ignore_index=-100)
        return loss, logits


def site_lm(form):
    torch.manual_seed(0)
    model = SiteLM(form).float().train()

    def make_inputs(case) -> zoo.Inputs:
        case = zoo._case(case)
        ids, mask, labels = zoo.tokens(case)
        return zoo.Inputs((ids, mask, labels), {}, case, lambda o: o[0], lambda o: o[1], zoo.VOCAB)

    return model, make_inputs


def check(form, case, options):
    model, make_inputs = site_lm(form)
    inputs = make_inputs(case)
    run = run_eager_and_compiled(model, inputs, {"strict": True, **options})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    errors = assert_grads_match(run.ref_grads, run.grads)
    assert not run.warnings, run.warnings
    layers = {p.name for p in run.programs if p.name.startswith("layer")}
    assert layers == {f"layer.{i}" for i in range(zoo.LAYERS)}, (sorted(layers), run.warnings)
    n = chunk_count(inputs.T, options["chunk_size"])
    for name in layers:  # forward, then the backward's recomputation: every run in n chunks
        assert run.schedules[name] and set(run.schedules[name]) == {n}, (name, run.schedules)
    return run, errors


@pytest.mark.fast
@pytest.mark.parametrize("form", FORMS)
def test_layer_forms_stream_exactly(form):
    check(form, "left_pad", {"chunk_size": 5})


# every chunk size of every form, each with one of the two cases (alternating by form and size:
# each (case, chunk size) pair on three forms); the default run: each form at one size, each size
# on two forms
@pytest.mark.slow
@pytest.mark.parametrize("form, chunk", cases([(f, c) for f in FORMS for c in (1, 16, 23)],
                                              [(f, (1, 16, 23)[i % 3]) for i, f in enumerate(FORMS)]),
                         ids=[f"{f}-{c}" for f in FORMS for c in (1, 16, 23)])
def test_layer_forms_at_every_chunk_size(form, chunk):
    case = ("prompt", "right_pad")[(FORMS.index(form) + [1, 16, 23].index(chunk)) % 2]
    check(form, case, {"chunk_size": chunk})


@pytest.mark.slow
@pytest.mark.parametrize("form", ["diff", "where"])
def test_layer_forms_inductor(form):
    check(form, "left_pad", {"chunk_size": 5, "codegen": "inductor"})


@pytest.mark.fast
def test_two_sites_share_one_key_prefix():
    """Differential attention's two calls read one query and key: the K/V graph keeps the keys
    once (and each half of the values), and explain() lists both sites in one layer."""
    import streamfx

    model, make_inputs = site_lm("diff")
    inputs = make_inputs("b1")
    report = streamfx.explain(model, *inputs.args, options={"chunk_size": 5})
    layers = [p for p in report.plan if p.name.startswith("layer")]
    assert len(layers) == zoo.LAYERS, str(report)
    for p in layers:
        assert len(p.sites) == 2, p.describe()
        shapes = [tuple(x.meta["val"].shape) for x in p.kv_outputs]
        assert len(shapes) == 3, (p.describe(), shapes)  # K once, two halves of V
        assert "2 attention sites" in p.describe()



# ---- a layer input laid out as a transposed view ----------------------------------------------------
class GatedRest(nn.Module):
    """The rest of a layer after a graph break that hands it a per-head gate as [B, H, T, hd], a
    transposed view of [B, T, H, hd] memory (as JetMoE's attention experts hand the queries on):
    ``(gate * attention).transpose(1, 2).view(B, T, d)`` is a view for that layout only."""

    def __init__(self, d=zoo.HIDDEN, n_head=zoo.HEADS):
        super().__init__()
        self.h, self.hd = n_head, d // n_head
        self.n1, self.n2 = zoo.RMSNorm(d), zoo.RMSNorm(d)
        self.qkv, self.o = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.mlp = zoo.SwiGLU(d, 2 * d)

    def forward(self, x, gate):
        B, T, d = x.shape
        q, k, v = (t.view(B, T, self.h, self.hd).transpose(1, 2) for t in self.qkv(self.n1(x)).split(d, -1))
        y = (gate * F.scaled_dot_product_attention(q, k, v, is_causal=True)).transpose(1, 2).view(B, T, d)
        x = x + self.o(y)
        return x + self.mlp(self.n2(x))


class GatedBlock(nn.Module):
    def __init__(self, d=zoo.HIDDEN, n_head=zoo.HEADS):
        super().__init__()
        self.h, self.gate, self.rest = n_head, nn.Linear(d, d, bias=False), GatedRest(d, n_head)

    def forward(self, x):
        B, T, d = x.shape
        gate = torch.sigmoid(self.gate(x)).view(B, T, self.h, d // self.h).transpose(1, 2)
        return self.rest(x, gate)


class GatedLM(nn.Module):
    def __init__(self, vocab=zoo.VOCAB, d=zoo.HIDDEN):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(GatedBlock(d) for _ in range(zoo.LAYERS))
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx, labels):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(x)
        return F.cross_entropy(logits.reshape(-1, self.vocab), labels.reshape(-1)), logits


@pytest.mark.parametrize("codegen", [pytest.param("eager", marks=pytest.mark.fast),
                                     pytest.param("inductor", marks=pytest.mark.slow)])
def test_transposed_view_input_keeps_its_layout_per_chunk(codegen):
    """Each layer's rest is compiled alone (a graph piece) and gets the gate as a transposed view;
    its chunks copy the gate's rows in the same dim order, so the view the graph was traced with
    holds per chunk (a row-major copy failed with "Cannot view a tensor with shape [2, s55, 4, 8]")."""
    from streamfx.chunks import COUNTERS

    torch.manual_seed(0)
    model = GatedLM().train()
    ids = torch.randint(1, zoo.VOCAB, (2, 17))
    ref = copy.deepcopy(model)
    ref(ids, ids)[0].backward()
    for layer in model.layers:
        layer.rest.compile(backend="streambp", options={"chunk_size": 5, "strict": True, "codegen": codegen})
    before = dict(COUNTERS)
    loss = model(ids, ids)[0]
    loss.backward()
    ran = {k: COUNTERS[k] - before[k] for k in COUNTERS}
    assert ran["region_forward"] == zoo.LAYERS and ran["chunks_backward"] == zoo.LAYERS * 4, ran
    assert_grads_match(grads_of(ref), grads_of(model))


# ---- Hugging Face families -------------------------------------------------------------------------
HF_FAMILIES = {
    "diffllama": ("sdpa", {}),                 # two SDPA calls per layer
    "gpt_neo": ("eager", {"window_size": 4}),  # where(causal) + the additive mask; a local layer (window 4)
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(HF_FAMILIES))
def test_hf_families_stream_every_layer(family):
    import arch_configs

    attn, overrides = HF_FAMILIES[family]
    model = arch_configs.build(family, attn, **overrides)
    batch = arch_configs.inputs(model, B=2, T=12, seed=0, pad="left")
    inputs = zoo.Inputs((), batch, zoo._case("left_pad"), lambda o: o.loss, lambda o: o.logits, 0)
    run = run_eager_and_compiled(model, inputs, {"strict": True, "chunk_size": 5})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    # (DiffLlama's lambda gradients are sums that cancel: eager fp32 is 3e-5 from fp64 there)
    assert_grads_match(run.ref_grads, run.grads)
    layers = {p.name for p in run.programs if p.name.startswith("layer")}
    assert layers == {"layer.0", "layer.1"}, (sorted(layers), run.warnings)
    assert not run.warnings, run.warnings


@pytest.mark.slow
def test_jetmoe_with_captured_scalars():
    """JetMoE with Dynamo's ``capture_scalar_outputs`` (as the graph-break warning advises): its
    experts count their tokens (``gates.long().sum(0).tolist()``) and split the sorted rows by
    those counts, its attention experts map the queries through the same groups and back. Every
    layer streams exactly under strict=True (tests/test_expert_groups.py: the dispatch alone)."""
    import arch_configs

    model = arch_configs.build("jetmoe", "sdpa")
    batch = arch_configs.inputs(model, B=2, T=12, seed=0, pad="left")
    inputs = zoo.Inputs((), batch, zoo._case("left_pad"), lambda o: o.loss, lambda o: o.logits, 0)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        run = run_eager_and_compiled(model, inputs, {"strict": True, "chunk_size": 5})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    layers = {p.name for p in run.programs if p.name.startswith("layer")}
    assert layers == {"layer.0", "layer.1"}, (sorted(layers), run.warnings)
    assert not run.warnings, run.warnings

