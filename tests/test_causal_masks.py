"""A mask read at run time that turns out exactly causal runs the kernel's own causal attention.

Trainers pass an all-ones ``attention_mask``, and a mask too long to evaluate at compile time
(``passes.masks.MAX_EVAL``) is planned from its values at run time: both keep the mask in the
chunk graph, a [chunk, keys] tensor per chunk that also rules out the fastest kernels. Each call
reads the mask anyway (``keyranges``, for the keys each chunk reads); where every chunk's rows
are exactly causal, the layer runs a copy of its query graph without the masks. Padding, packed
documents, windows and biases keep the mask."""
import math

import pytest
import torch

import zoo
from conftest import assert_grads_match, run_eager_and_compiled
from streamfx import keyranges

pytestmark = pytest.mark.fast
NEG = torch.finfo(torch.float32).min


def causal(s, e, n):
    return torch.arange(n) <= torch.arange(s, e).unsqueeze(1)


def flag(block, rows, kind="allowed", query_dim=-2):
    return int(keyranges.reach(block, rows, kind, False, -1, query_dim)[3])


# ---- the check on one chunk's mask -----------------------------------------------------------------
def test_reach_flags_exactly_causal_blocks():
    n = 12
    ok = causal(4, 8, n)[None, None]                    # [B, 1, c, n], rows 4..7
    assert flag(ok, (4, 8)) == 1
    assert flag(ok.expand(2, 3, 4, n), (4, 8)) == 1     # broadcast over batch and heads
    assert flag(ok, (3, 7)) == 0                        # the same rows read as other rows
    hole = ok.clone()
    hole[0, 0, 1, 0] = False                            # one padded key
    assert flag(hole, (4, 8)) == 0
    window = ok & (torch.arange(n) > torch.arange(4, 8).unsqueeze(1) - 3)
    assert flag(window, (4, 8)) == 0
    assert flag(ok, (4, 8), query_dim=None) == 0        # no query dim: one row broadcast to all
    assert flag(ok[:, :, :1], (4, 8)) == 0              # a broadcast row is not the chunk's rows
    assert flag(~ok, (4, 8), kind="hidden") == 1        # True = masked convention


@pytest.mark.parametrize("fill", [float("-inf"), NEG])
def test_reach_additive_masks_must_add_zero(fill):
    n = 10
    allowed = causal(2, 6, n)[None, None]
    additive = torch.zeros(1, 1, 4, n).masked_fill(~allowed, fill)
    assert flag(additive, (2, 6), kind="additive") == 1
    biased = additive + torch.where(allowed, 0.5, 0.0)      # ALiBi-like: a bias on what is seen
    assert flag(biased, (2, 6), kind="additive") == 0


# ---- models -------------------------------------------------------------------------------------------
def _run(model, inputs, **options):
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "strict": True, **options})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert not run.warnings, run.warnings
    return run


@pytest.mark.heavy
@pytest.mark.parametrize("codegen", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_an_all_ones_attention_mask_runs_causal_attention(codegen):
    model, make_inputs = zoo.qwen3("sdpa")
    ids = make_inputs("prompt").kwargs["input_ids"]
    run = _run(model, make_inputs("prompt", attention_mask=torch.ones_like(ids)), codegen=codegen)
    layers = [p for p in run.programs if p.kind == "layer"]
    assert layers and all(p.causal is not None for p in layers)
    # every layer's forward and backward, from at most one mask check (none where an earlier
    # call read the same mask values)
    assert run.counters["mask_found_causal"] == 2 * len({p.name for p in layers}) == 2 * zoo.LAYERS
    assert run.counters["mask_checks"] <= 1


@pytest.mark.parametrize("case", [pytest.param("left_pad", marks=pytest.mark.heavy), "right_pad"])
def test_padding_keeps_the_mask(case):
    model, make_inputs = zoo.qwen3("sdpa")
    run = _run(model, make_inputs(case))
    assert run.counters["mask_found_causal"] == 0


def test_a_window_shorter_than_the_sequence_keeps_the_mask():
    model, make_inputs = zoo.mistral_sliding("sdpa", window=5)
    ids = make_inputs("prompt").kwargs["input_ids"]
    run = _run(model, make_inputs("prompt", attention_mask=torch.ones_like(ids)))
    assert run.counters["mask_found_causal"] == 0


@pytest.mark.heavy
def test_a_mask_too_long_to_evaluate_at_compile_time(monkeypatch):
    """Planned from its values (``unevaluated``): causal at run time, so the causal kernel runs."""
    from streamfx.passes import masks

    monkeypatch.setattr(masks, "MAX_EVAL", 8)
    model, make_inputs = zoo.qwen3("sdpa")
    run = _run(model, make_inputs("prompt"))
    assert run.counters["mask_found_causal"] > 0


@pytest.mark.parametrize("kernel", [pytest.param("flash", marks=pytest.mark.heavy), "efficient",
                                    pytest.param("cudnn", marks=pytest.mark.heavy)])
def test_cuda_kernels_run_their_causal_form_under_an_all_ones_mask(kernel):
    """With the CUDA kernels emulated: SDPA gives the masked call to the efficient kernel (flash
    takes no mask) or to cuDNN; the copy without the mask runs that kernel's causal form (a
    top-left kernel's prefix and diagonal blocks), exactly."""
    from streamfx.passes import kernels
    from test_kernels import kernel_context

    model, make_inputs = zoo.qwen3("sdpa")
    ids = make_inputs("prompt").kwargs["input_ids"]
    with kernel_context(kernel):
        run = _run(model, make_inputs("prompt", attention_mask=torch.ones_like(ids)))
    assert run.counters["mask_found_causal"] == 2 * zoo.LAYERS
    fused = "efficient" if kernel == "flash" else kernel
    for prog in (p for p in run.programs if p.kind == "layer"):
        masked = [kernels.of(n).name for n in prog.chunk.gm.graph.nodes if kernels.of(n) is not None]
        blocks = [n.args[0] for n in prog.causal.gm.graph.nodes
                  if n.target is torch.ops.streamfx.causal_blocks.default]
        assert masked == [fused] and blocks == [fused], (masked, blocks)


class _TinyScoresLM(torch.nn.Module):
    """Layers of attention written out (``attend``, each subclass's scores), a residual, an LM head
    and a shifted cross-entropy; ``fill`` is the subclass's constant in its scores."""

    def __init__(self, fill, vocab=zoo.VOCAB, d=32, heads=4, layers=2):
        super().__init__()
        torch.manual_seed(0)
        self.fill, self.heads, self.vocab = fill, heads, vocab
        self.embed = torch.nn.Embedding(vocab, d)
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d, 3 * d) for _ in range(layers))
        self.out = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx, labels):
        B, T = idx.shape
        x = self.embed(idx)
        for qkv, out in zip(self.qkv, self.out):
            q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in qkv(x).chunk(3, -1))
            x = x + out(self.attend(q, k, v).transpose(1, 2).reshape(B, T, -1))
        logits = self.head(x)
        shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, self.vocab), shifted.reshape(-1)), logits


class _ProductMaskLM(_TinyScoresLM):
    """GPT-1's attention mask: a registered [T, T] tril of ones ``b`` applied to the scores as
    ``w * b + fill * (1 - b)``: masked scores are ``fill`` whatever their value."""

    def __init__(self, fill, max_pos=64):
        super().__init__(fill)
        self.register_buffer("bias", torch.tril(torch.ones(max_pos, max_pos)).view(1, 1, max_pos, max_pos),
                             persistent=False)

    def attend(self, q, k, v):
        T = q.shape[-2]
        w = q @ k.transpose(-1, -2) / 8 ** 0.5
        b = self.bias[:, :, :T, :T]
        w = w * b + self.fill * (1 - b)
        return torch.softmax(w, -1) @ v


@pytest.mark.heavy
def test_a_causal_mask_with_a_finite_fill_says_why_it_does_not_stream_and_what_to_change():
    """A causal mask whose hidden scores get a finite value above the hiding rule's (GPT-1's
    -1e4): a masked key's weight is then not zero for every score, so the layer does not stream;
    the warning gives that cause (not "not causal") and the remedy, and strict raises it. With the
    remedy (``finfo.min``) the same model streams every layer, exactly."""
    from streamfx import StreamBPError

    inputs = zoo._plain_inputs(zoo.VOCAB)("left_pad")
    run = run_eager_and_compiled(_ProductMaskLM(-1e4), inputs, {"chunk_size": 5})
    assert_grads_match(run.ref_grads, run.grads)
    said = [m for m in run.warnings if "not streamed" in m]
    # (one warning for the two layers: the same cause)
    assert len(said) == 1 and all("-10000" in m and "torch.finfo(dtype).min" in m and "causal mask" in m
                                  and "not causal" not in m for m in said), run.warnings
    assert "region 'layer.0' is not streamed (nor is 'layer.1', for the same cause)" in said[0], said
    assert not [p for p in run.programs if p.kind == "layer"]
    with pytest.raises(StreamBPError, match="-10000"):
        run_eager_and_compiled(_ProductMaskLM(-1e4), inputs, {"chunk_size": 5, "strict": True})
    run = _run(_ProductMaskLM(torch.finfo(torch.float32).min), inputs)
    assert len([p for p in run.programs if p.kind == "layer"]) == 2


class _BaddbmmLM(_TinyScoresLM):
    """GPT-NeoX-Japanese's attention: scores from ``baddbmm`` on a ``[B*H, T, T]`` input of
    ``fill`` (zeros there), then an additive causal mask."""

    def attend(self, q, k, v):
        B, H, T, _ = q.shape
        pos = torch.arange(T, device=q.device)
        mask = torch.zeros(T, T).masked_fill(pos[None, :] > pos[:, None], NEG)
        w = torch.baddbmm(torch.full((B * H, T, T), self.fill), q.reshape(B * H, T, -1),
                          k.reshape(B * H, T, -1).transpose(1, 2), alpha=8 ** -0.5)
        w = w.view(B, H, T, T) + mask
        return (torch.softmax(w, -1).view(B * H, T, T) @ v.reshape(B * H, T, -1)).view(B, H, T, -1)


@pytest.mark.parametrize("fill", [0.0, 2.5])
def test_a_constant_term_in_the_scores_is_no_mask(fill):
    """A term with one value at every (query, key) pair entering the scores (``baddbmm``'s zeros
    input) hides no key: beside the additive causal mask it is not a second mask term (which
    refused the layer as masks "not read as one"); every layer streams, exactly, strict."""
    run = _run(_BaddbmmLM(fill), zoo._plain_inputs(zoo.VOCAB)("left_pad"))
    assert len([p for p in run.programs if p.kind == "layer"]) == 2


class _SelectedKeysLM(_TinyScoresLM):
    """A sparse attention's key selection made from the model's activations: before the layers, a
    learned score of each token (an embedding of its own) selects the keys every query may see
    (with itself),
    ``causal & (selected[key] | key == query)``, applied by SDPA (``form="sdpa"``, boolean) or to
    written-out scores (``form="eager"``, ``masked_fill`` with ``finfo.min``). With neutral
    inputs (every token the same) every key or none is selected: only the call's values tell."""

    def __init__(self, form):
        super().__init__(None)
        self.form = form
        self.select = torch.nn.Embedding(self.vocab, 1)

    def forward(self, idx, labels):
        # (the selection's embedding comes first in the graph, before the token embedding)
        pos = torch.arange(idx.shape[1], device=idx.device)
        picked = (self.select(idx).squeeze(-1) > 0)[:, None, None, :] | (pos[None, :] == pos[:, None])
        self.mask = (pos[None, :] <= pos[:, None]) & picked
        return super().forward(idx, labels)

    def attend(self, q, k, v):
        if self.form == "sdpa":
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
        w = (q @ k.transpose(-1, -2) / 8 ** 0.5).masked_fill(~self.mask, NEG)
        return torch.softmax(w, -1) @ v


@pytest.mark.parametrize("form", ["sdpa", pytest.param("eager", marks=pytest.mark.heavy)])
def test_a_mask_made_from_activations_is_read_per_call(form):
    """A mask computed from the model's activations (a key selection from learned token scores)
    has no pattern to read at compile time: it is planned as causal and read at
    every call, so every layer streams (strict) with eager autograd's gradients, for inputs that
    select some keys and hide others."""
    import streamfx

    torch.manual_seed(0)
    model = _SelectedKeysLM(form)
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    picked = model.select(inputs.args[0]).squeeze(-1) > 0
    assert picked.any() and not picked.all()   # (the call's selection hides some keys)
    run = _run(model, inputs)
    layers = [p for p in run.programs if p.kind == "layer"]
    assert len(layers) == 2, run.warnings
    text = str(streamfx.explain(model, *inputs.args, options={"chunk_size": 5}))
    sites = [line for line in text.splitlines() if " mask=" in line]
    # (not "causal": the pattern neutral inputs give, every token's score the same)
    assert len(sites) == 2 and all("mask=data" in line for line in sites), text
    assert "under the mask (data), read from the mask per call" in text, text


class _KeyBiasLM(_TinyScoresLM):
    """Doge's dynamic mask: a bias per key made from the values (``exp(A * softplus(dt(v)))``),
    broadcast along the queries and hidden by the causal mask (``masked_fill`` with
    ``finfo.min``), applied by SDPA (``form="sdpa"``) or added to written-out scores."""

    def __init__(self, form):
        super().__init__(None)
        self.form = form
        d = self.embed.embedding_dim
        self.dt = torch.nn.ModuleList(torch.nn.Linear(d, self.heads) for _ in self.qkv)
        self.A = torch.nn.Parameter(torch.randn(self.heads))

    def forward(self, idx, labels):
        B, T = idx.shape
        x = self.embed(idx)
        pos = torch.arange(T, device=idx.device)
        causal = pos[None, :] <= pos[:, None]
        for qkv, dt, out in zip(self.qkv, self.dt, self.out):
            q, k, v = (t.view(B, T, self.heads, -1).transpose(1, 2) for t in qkv(x).chunk(3, -1))
            bias = torch.exp(self.A * torch.nn.functional.softplus(dt(v.transpose(1, 2).reshape(B, T, -1))))
            mask = bias.transpose(-1, -2)[:, :, None, :].expand(-1, -1, T, -1).masked_fill(~causal, NEG)
            if self.form == "sdpa":
                a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            else:
                a = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5 + mask, -1) @ v
            x = x + out(a.transpose(1, 2).reshape(B, T, -1))
        logits = self.head(x)
        shifted = torch.nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, self.vocab), shifted.reshape(-1)), logits


@pytest.mark.parametrize("form", ["sdpa", "eager"])
def test_a_bias_per_key_made_from_the_values_streams(form):
    """A term per key that the layer computes from its own rows and adds to every query's scores
    (Doge's dynamic mask) is made on the key side, as the keys are: a chunk reads it for its
    keys [0, e). The layer's mask check reads it as zero (it is not known for every key while a
    chunk runs) and never takes a block for exactly causal, so the bias is always applied:
    every layer streams (strict), with eager autograd's gradients."""
    torch.manual_seed(0)
    model = _KeyBiasLM(form)
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    run = _run(model, inputs)
    assert len([p for p in run.programs if p.kind == "layer"]) == 2, run.warnings


class _RowStatisticLM(_TinyScoresLM):
    """Attention that scales its output by a statistic of each row's scores over the keys, with
    ``fill`` the score of a hidden key: GraniteSWA's sink, ``sigmoid(logsumexp(scores) - sink)``
    (``stat="lse"``), or the row's largest score (``stat="max"``); ``stat="sum"``: the sum of the
    row's scores clamped at -10 (a hidden key counts -10), and ``stat="lse-unmasked"``: the
    log-sum-exp of the scores before the mask, which depend on the keys a chunk does not read."""

    def __init__(self, stat, fill=NEG):
        super().__init__(fill)
        self.stat = stat
        self.sink = torch.nn.Parameter(torch.randn(self.heads))

    def attend(self, q, k, v):
        T = q.shape[-2]
        pos = torch.arange(T, device=q.device)
        raw = q @ k.transpose(-1, -2) / 8 ** 0.5
        w = raw.masked_fill(pos[None, :] > pos[:, None], self.fill)
        if self.stat == "lse-unmasked":
            row = torch.logsumexp(raw, dim=-1)
        elif self.stat == "lse":
            row = torch.logsumexp(w, dim=-1)
        elif self.stat == "max":
            row = w.amax(-1)
        else:
            row = w.clamp_min(-10).sum(-1) / 8
        scale = torch.sigmoid(row - self.sink.view(1, -1, 1))
        return (torch.softmax(w, -1) @ v) * scale.unsqueeze(-1)


@pytest.mark.parametrize("stat,fill", [("lse", NEG), ("lse", -math.inf),
                                       ("max", NEG)])
def test_a_statistic_of_the_scores_over_the_keys_streams(stat, fill):
    """A maximum or log-sum-exp of each row's scores over the keys, read after the attention
    (GraniteSWA's sink scaling), is computed by each chunk from the keys it reads: a hidden key
    changes neither. Every layer streams (strict), with eager autograd's gradients."""
    run = _run(_RowStatisticLM(stat, fill), zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13)))
    assert len([p for p in run.programs if p.kind == "layer"]) == 2


@pytest.mark.parametrize("stat,line", [("sum", "w.clamp_min(-10).sum(-1)"),
                                       pytest.param("lse-unmasked", "torch.logsumexp(raw, dim=-1)", marks=pytest.mark.heavy)])
def test_a_statistic_that_counts_the_hidden_keys_is_refused(stat, line):
    """A sum of each row's scores over the keys (clamped: a hidden key counts), or a log-sum-exp
    of the scores before the mask, counts keys a chunk does not read: the layers run unstreamed,
    warned with the op and its line, exactly."""
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    run = run_eager_and_compiled(_RowStatisticLM(stat), inputs, {"chunk_size": 5})
    assert_grads_match(run.ref_grads, run.grads)
    assert not [p for p in run.programs if p.kind == "layer"]
    assert any(line in w for w in run.warnings), run.warnings
