"""The streamed LM head + loss region: chunk sizes, ignored labels, HF's num_items_in_batch,
return_logits, tied embeddings, the size of what a chunk holds, RL-style losses (DPO, GRPO), bf16.

Parity is against eager autograd on a deep copy with the same weights (``conftest``); every
parity test also checks that the head streamed (a "head" region program ran chunk by chunk), so a
silently skipped pass fails. ``codegen="eager"`` throughout, but for the losses at a temperature,
whose graph Inductor's joint-graph passes rewrite.
"""
import copy
import warnings
from collections import Counter

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import streamfx
import zoo
from streamfx.passes.specs import SUM
from conftest import (assert_grads_match, assert_head_not_streamed, assert_streamed, at_chunk_size, grads_of,
                      head_plans, record_schedules, relative_error, run_eager_and_compiled)
from streamfx.passes.schedule import chunk_count

EAGER = {"codegen": "eager"}


def parity(model, inputs, head_chunk_size, rtol=1e-4, exact_schedule=True, T=None, **options):
    """``T``: the length the head streams over (default the input length)."""
    run = run_eager_and_compiled(model, inputs, {**EAGER, "head_chunk_size": head_chunk_size, **options})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads, rtol=rtol)
    assert_streamed(run, T=T or inputs.T, head_chunk_size=head_chunk_size, exact_schedule=exact_schedule)
    return run


# ---- chunk sizes ----------------------------------------------------------------------------------
T_PROMPT = zoo.CASES["prompt"].T  # 16


@pytest.mark.fast
@pytest.mark.parametrize("chunk", [1, 7, T_PROMPT - 1, T_PROMPT, T_PROMPT + 24],
                         ids=["c1", "c7", "cT-1", "cT", "c>T"])
def test_head_chunk_sizes(chunk):
    """nanoGPT (tied wte/lm_head, ignore_index=-100 over a prompt span), B=2, T=16."""
    model, make_inputs = zoo.nanogpt()
    inputs = make_inputs("prompt")
    run = parity(model, inputs, chunk)
    n_chunks = chunk_count(T_PROMPT, chunk)  # 16, 3, 2, 1, 1
    # one forward pass that also computes the loss's gradients (a scalar loss: head_grad="auto")
    assert run.head_passes == 1 and run.schedules["head"] == [n_chunks]


# ---- ignored labels -------------------------------------------------------------------------------
@pytest.mark.fast
def test_chunk_entirely_ignored():
    """Qwen3 (HF loss shifts labels): labels -100 on tokens 0..8 of both rows, so after the shift
    targets 0..7 are ignored: head chunks [0, 4) and [4, 8) contain no counted token at all."""
    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs(zoo.Case("ignored_chunks", 2, 16, ignore=(0, 9)))
    shifted = F.pad(inputs.kwargs["labels"], (0, 1), value=-100)[:, 1:]
    assert (shifted[:, 0:8] == -100).all() and (shifted[:, 8:15] != -100).all()
    parity(model, inputs, 4)


def test_chunk_starting_on_ignored_label():
    """nanoGPT targets (already shifted): -100 at targets 4 and 5, so chunk [4, 8) starts on an
    ignored token and also counts tokens 6, 7; the previous chunk ends on a counted token."""
    model, make_inputs = zoo.nanogpt()
    inputs = make_inputs(zoo.Case("starts_ignored", 2, 16, ignore=(5, 7)))
    targets = inputs.args[1]
    assert (targets[:, 4:6] == -100).all() and (targets[:, 3] != -100).all() and (targets[:, 6:8] != -100).all()
    parity(model, inputs, 4)


# ---- HF num_items_in_batch -----------------------------------------------------------------------
@pytest.mark.parametrize("as_tensor", [True], ids=["tensor"])  # the Trainer passes a tensor
def test_num_items_in_batch(as_tensor):
    """HF loss with ``num_items_in_batch`` (gradient accumulation): reduction="sum", then divided
    by num_items. Here num_items = 2 x the counted tokens, as for two equal micro-batches."""
    model, make_inputs = zoo.qwen3_sdpa()
    base = make_inputs("prompt")
    shifted = F.pad(base.kwargs["labels"], (0, 1), value=-100)[:, 1:]
    counted = int((shifted != -100).sum())
    n = 2 * counted
    inputs = make_inputs("prompt", num_items_in_batch=torch.tensor(n) if as_tensor else n)
    run = parity(model, inputs, 4)
    # the loss really is sum / num_items: half the mean over counted tokens
    mean_loss = copy.deepcopy(model)(**base.kwargs).loss.detach()
    torch.testing.assert_close(run.loss, mean_loss * counted / n, rtol=1e-5, atol=1e-6)


# ---- a loss over zero tokens ----------------------------------------------------------------------
@pytest.mark.fast
@pytest.mark.parametrize("reduction,head_grad", [("mean", "forward"),
                                                pytest.param("num_items_in_batch", "recompute", marks=pytest.mark.heavy),
                                                pytest.param("mean", "recompute", marks=pytest.mark.heavy),
                                                pytest.param("num_items_in_batch", "forward", marks=pytest.mark.heavy)])
def test_a_batch_with_every_label_ignored_gets_eagers_zero_gradients(head_grad, reduction):
    """Every label ignored (a prompt-only batch): HF's loss is 0 / 0, NaN in eager too, and its
    backward gives every weight a zero gradient (``nll_loss_backward`` masks the ignored rows after
    dividing by their count), so an optimizer step stays finite. The streamed head gets the same
    zeros: with its gradients kept from the forward (``head_grad="forward"``), the infinite
    incoming gradient times a kept gradient of zero is zero (said once); recomputed, the loss's
    own backward masks the rows."""
    import warnings

    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs("right_pad", **({"num_items_in_batch": torch.tensor(0)} if reduction != "mean" else {}))
    kwargs = dict(inputs.kwargs, labels=torch.full_like(inputs.kwargs["labels"], -100))
    ref = copy.deepcopy(model)
    ref_loss = ref(*inputs.args, **kwargs).loss
    ref_loss.backward()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="streambp", options={**EAGER, "chunk_size": 5, "head_chunk_size": 4,
                                                                 "head_grad": head_grad, "strict": True})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):   # (said once)
            model.zero_grad(set_to_none=True)
            loss = compiled(*inputs.args, **kwargs).loss
            loss.backward()
    said = [str(w.message) for w in caught if "streamfx" in str(w.message)]
    assert torch.isnan(ref_loss) and torch.isnan(loss)
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        assert r.grad is not None and not r.grad.any(), name   # (eager's: zeros)
        assert p.grad is not None and torch.equal(p.grad, r.grad), (name, p.grad.abs().max())
    assert len(said) == (head_grad == "forward"), said
    assert not said or "head_grad': 'recompute'" in said[0], said


# ---- return_logits ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["qwen3_sdpa"])
def test_return_logits_true(name):
    """return_logits=True: the [B, T, V] logits come back equal to eager's, grads stay exact,
    and the head still streams."""
    model, make_inputs = zoo.ZOO[name]()
    inputs = make_inputs("odd13")
    run = parity(model, inputs, 4, return_logits=True)
    logits, ref_logits = inputs.logits_of(run.out), inputs.logits_of(run.ref_out)
    assert logits is not None and logits.shape == (inputs.B, inputs.T, inputs.vocab)
    torch.testing.assert_close(logits, ref_logits.detach(), rtol=1e-5, atol=1e-5)


def test_return_logits_false_drops_logits():
    model, make_inputs = zoo.tiny_llama()
    inputs = make_inputs("odd13")
    run = parity(model, inputs, 4, return_logits=False)
    assert inputs.logits_of(run.out) is None
    assert inputs.logits_of(run.ref_out) is not None


class CountingLlama(zoo.TinyLlama):
    """A model that updates buffers in its forward: a call counter and a moving average of a
    weight, or (``statistic="tokens"``) of the embedded tokens, a reduction over the sequence.
    AOTAutograd keeps such updates in the graph as ``copy_`` into the buffer."""

    def __init__(self, statistic="weights"):
        super().__init__()
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.register_buffer("running", torch.zeros(zoo.HIDDEN))
        self.statistic = statistic

    def forward(self, idx, labels=None):
        self.calls += 1
        value = self.embed(idx).mean((0, 1)) if self.statistic == "tokens" else self.lm_head.weight.mean(0)
        self.running.mul_(0.9).add_(0.1 * value.detach())
        return super().forward(idx, labels)


@pytest.mark.fast
def test_buffer_updates_of_a_streamed_model():
    """The updates are forward roots of their own (they have no users): the streamed graph keeps
    them, the layers and the head stream, and the logits dropped by the streamed head come back
    as None (the dropped output is found among the user's outputs, after the mutated buffers)."""
    torch.manual_seed(0)
    model = CountingLlama().float().train()
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    run = parity(model, inputs, 4, return_logits=False, chunk_size=5)
    assert inputs.logits_of(run.out) is None
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, run.warnings
    assert run.model.calls.item() == 1 and torch.equal(run.model.running, run.ref_model.running)


def test_buffer_statistic_over_the_tokens_is_exact():
    """A buffer statistic reduced over the sequence: exact, the update applied once."""
    torch.manual_seed(0)
    model = CountingLlama(statistic="tokens").float().train()
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "head_chunk_size": 4})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert run.model.calls.item() == 1
    torch.testing.assert_close(run.model.running, run.ref_model.running)



@torch.library.custom_op("streamfx_test::decay_into", mutates_args=("buf",))
def _decay_into(x: torch.Tensor, buf: torch.Tensor) -> None:
    """``buf <- buf / 2 + sum(x)``: an update that depends on the whole of ``x`` and on the order
    of the calls (applied per chunk or twice it gives another value)."""
    buf.copy_(buf * 0.5 + x.detach().sum())


@_decay_into.register_fake
def _(x, buf):
    return None


class RecordingMLP(torch.nn.Module):
    """An MLP whose output a custom op that mutates a buffer records (AOTAutograd: an
    ``auto_functionalized`` call whose first output is None, then a copy into the buffer)."""

    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp
        self.register_buffer("seen", torch.ones(()))

    def forward(self, x):
        y = self.mlp(x)
        _decay_into(y, self.seen)
        return y


@pytest.mark.parametrize("codegen", [pytest.param("eager", marks=pytest.mark.fast), "inductor"])
def test_a_custom_op_that_updates_a_buffer_inside_a_layer(codegen):
    """The update runs once, on the whole output, and every layer and the head stream (with eager
    codegen the op's None output, read by nothing, once reached the partitioner and left the
    graph unstreamed)."""
    model, make_inputs = zoo.tiny_llama()
    for block in model.layers:
        block.mlp = RecordingMLP(block.mlp)
    run = run_eager_and_compiled(model, make_inputs("odd13"), {"chunk_size": 5, "head_chunk_size": 4,
                                                               "codegen": codegen})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, run.warnings
    assert not run.warnings, run.warnings
    for got, ref in zip(run.model.layers, run.ref_model.layers):
        torch.testing.assert_close(got.mlp.seen, ref.mlp.seen)
        assert ref.mlp.seen.item() != 1.0

# ---- tied embeddings ---------------------------------------------------------------------------------
@pytest.mark.fast
def test_tied_embedding_grads_add_up():
    """Llama with tie_word_embeddings: the one weight's gradient is the embedding's contribution
    plus the LM head's (the head part is accumulated over chunks, the embedding part outside)."""
    model, make_inputs = zoo.llama_tied()
    inputs = make_inputs("right_pad")
    run = parity(model, inputs, 4)
    tied = "model.embed_tokens.weight"
    assert "lm_head.weight" not in run.grads  # one parameter
    # eager reference with the two uses untied: the contributions separately
    untied = copy.deepcopy(model)
    untied.lm_head.weight = nn.Parameter(untied.model.embed_tokens.weight.detach().clone())
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight
    untied(**inputs.kwargs).loss.backward()
    emb_part, head_part = untied.model.embed_tokens.weight.grad, untied.lm_head.weight.grad
    assert emb_part.abs().max() > 0 and head_part.abs().max() > 0
    assert relative_error(run.grads[tied], emb_part + head_part) <= 1e-4
    assert relative_error(run.grads[tied], head_part) > 1e-3  # really the sum, not one part


@pytest.mark.parametrize("name", ["qwen3_sdpa", "tiny_llama"])
def test_frozen_lm_head_gets_no_gradient_buffer(name):
    """A frozen LM head (requires_grad=False): the head region computes no gradient for its
    weight, so no fp32 accumulation buffer of V x hidden exists; every other gradient is exact."""
    model, make_inputs = zoo.ZOO[name]()
    model.lm_head.weight.requires_grad_(False)
    inputs = make_inputs("prompt")
    run = parity(model, inputs, 4)
    assert run.model.lm_head.weight.grad is None and run.ref_model.lm_head.weight.grad is None
    weight = model.lm_head.weight.numel()
    for prog in run.programs_named("head"):
        sizes = [prog.full_gm.graph.find_nodes(op="placeholder")[i].meta["val"].numel() for i in prog.grad_inputs]
        assert weight not in sizes, f"the frozen weight gets a gradient buffer: {sizes}"
        assert prog.grad_inputs, "the hidden states still need their gradient"


@pytest.mark.fast
@pytest.mark.heavy
def test_a_vocabulary_as_wide_as_the_hidden_state_streams_its_projection():
    """V == d: the logits are as narrow as the hidden state, and the head's entry is still the
    hidden state before the LM head's projection, not the logits after it (with those, the logits
    and their log-softmax ran whole and only the label gather streamed): every chunk computes its
    own logits, exactly."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=zoo.HIDDEN, hidden_size=zoo.HIDDEN, intermediate_size=64, num_hidden_layers=zoo.LAYERS,
                      num_attention_heads=zoo.HEADS, num_key_value_heads=zoo.KV_HEADS, head_dim=zoo.HEAD_DIM,
                      max_position_embeddings=zoo.MAX_POS, tie_word_embeddings=False, pad_token_id=zoo.PAD_ID)
    model = zoo._hf(Qwen3ForCausalLM, cfg, "sdpa")
    run = parity(model, zoo._hf_inputs(zoo.HIDDEN)("prompt"), 4)
    heads = [p for p in run.programs if p.name == "head"]
    assert heads
    for head in heads:
        ops = {n.target for n in head.chunk.gm.graph.nodes if n.op == "call_function"}
        assert torch.ops.aten.mm.default in ops and torch.ops.aten.amax.default in ops, sorted(map(str, ops))


# ---- what a chunk holds ---------------------------------------------------------------------------
def test_chunk_graph_holds_at_most_chunk_logits():
    """Walk explain()'s head plan and the chunk graph it registered: no value of the chunk graph
    holds more than B x head_chunk_size x V elements, while the head region before rewriting
    holds the full B x T x V logits (and drops them as an output). Inputs passed whole (the LM
    head weight, scalars) are not per-token values and are left out: here the weight is
    hidden x V = 32 x 96, as many elements as the full logits."""
    from streamfx.runtime import _PROGRAMS

    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs("prompt")
    B, T, V, c = inputs.B, inputs.T, inputs.vocab, 4
    keys = set(_PROGRAMS)
    report = streamfx.explain(model, *inputs.args, options={"head_chunk_size": c}, **inputs.kwargs)
    (plan,) = head_plans(report)
    assert (plan.chunk_size, plan.length) == (c, T)
    assert plan.dropped, "the logits output should be dropped from the head region"
    full = max(n.meta["val"].numel() for n in plan.nodes if isinstance(n.meta.get("val"), torch.Tensor))
    assert full == B * T * V
    heads = [p for k, p in _PROGRAMS.items() if k not in keys and p.name == "head"]
    assert heads and all(p.chunk_size == c for p in heads)
    for head in heads:
        gm = at_chunk_size(head.chunk, c)
        placeholders = list(gm.graph.find_nodes(op="placeholder"))[:len(head.chunk.slots)]
        assert len(placeholders) == len(head.in_specs)
        whole = {p for p, spec in zip(placeholders, head.in_specs) if spec.kind == "whole"}
        assert any(tuple(p.meta["val"].shape) == (zoo.HIDDEN, V) for p in whole)  # the LM head weight
        numels = {}
        for n in gm.graph.nodes:
            if n in whole:
                continue
            vals = n.meta.get("val")
            for v in (vals if isinstance(vals, (tuple, list)) else [vals]):
                if isinstance(v, torch.Tensor):
                    numels[n.name] = max(numels.get(n.name, 0), v.numel())
        assert numels, "chunk graph without tensor metadata"
        too_big = {k: v for k, v in numels.items() if v > B * c * V}
        assert not too_big, f"chunk graph nodes above B*c*V={B * c * V}: {too_big}"
        assert max(numels.values()) == B * c * V  # the chunk's logits are there


# ---- RL-style losses on a shared tiny transformer ------------------------------------------------------
def per_token_logps(logits, labels, shift="labels"):
    """log p(label_t+1 | ..t) per token and the mask of counted tokens.

    shift="labels": labels shifted left (HF/TRL-roll style), logits untouched;
    shift="logits": the classic logits[:, :-1] / labels[:, 1:]."""
    if shift == "logits":
        logits, labels = logits[:, :-1], labels[:, 1:]
    else:
        labels = F.pad(labels, (0, 1), value=-100)[:, 1:]
    mask = labels != -100
    safe = torch.where(mask, labels, torch.zeros_like(labels))
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    return logp * mask, mask


class DPOLoss(nn.Module):
    """DPO on a shared policy: chosen and rejected in one batch, summed token log-probs per
    sequence, reference sums as inputs. ``form="logsigmoid"`` is -logsigmoid(beta * margin) as
    written in the paper/TRL; ``form="softplus"`` the identical softplus(-beta * margin)."""

    def __init__(self, lm, beta=0.1, form="logsigmoid"):
        super().__init__()
        self.lm, self.beta, self.form = lm, beta, form

    def forward(self, chosen, chosen_labels, rejected, rejected_labels, ref_chosen, ref_rejected):
        _, logits = self.lm(torch.cat([chosen, rejected]))
        logp, _ = per_token_logps(logits, torch.cat([chosen_labels, rejected_labels]))
        sum_c, sum_r = logp.sum(-1).split(chosen.shape[0])
        margin = self.beta * ((sum_c - ref_chosen) - (sum_r - ref_rejected))
        if self.form == "softplus":
            return F.softplus(-margin).mean()
        return -F.logsigmoid(margin).mean()


class GRPOLoss(nn.Module):
    """GRPO/PPO per-token clipped objective, masked mean over the counted tokens."""

    def __init__(self, lm, eps=0.2, shift="labels"):
        super().__init__()
        self.lm, self.eps, self.shift = lm, eps, shift

    def forward(self, ids, labels, old_logp, advantages):
        _, logits = self.lm(ids)
        logp, mask = per_token_logps(logits, labels, self.shift)
        ratio = torch.exp(logp - old_logp)
        adv = advantages.unsqueeze(1)
        obj = torch.min(ratio * adv, torch.clamp(ratio, 1 - self.eps, 1 + self.eps) * adv)
        return -(obj * mask).sum() / mask.sum()


class PlainInputs:
    def __init__(self, args, B, T, vocab=zoo.VOCAB):
        self.args, self.kwargs, self.B, self.T, self.vocab = args, {}, B, T, vocab
        self.loss_of, self.logits_of = (lambda o: o), (lambda o: None)


def dpo_case(form="logsigmoid"):
    lm, _ = zoo.tiny_llama()
    ids_c, _, lab_c = zoo.tokens(zoo.Case("chosen", 2, 16, ignore=(0, 5), seed=11))
    ids_r, _, lab_r = zoo.tokens(zoo.Case("rejected", 2, 16, ignore=(0, 5), seed=12))
    g = torch.Generator().manual_seed(13)
    ref_c, ref_r = -40 + torch.randn(2, generator=g), -40 + torch.randn(2, generator=g)
    return DPOLoss(lm, form=form), PlainInputs((ids_c, lab_c, ids_r, lab_r, ref_c, ref_r), 4, 16)


def grpo_case(shift="labels"):
    lm, _ = zoo.tiny_llama()
    ids, _, labels = zoo.tokens(zoo.Case("completion", 2, 16, ignore=(0, 6), seed=21))
    with torch.no_grad():
        logp, mask = per_token_logps(lm(ids)[1], labels, shift)
    g = torch.Generator().manual_seed(22)
    old = logp + 0.3 * torch.randn(logp.shape, generator=g)  # ratios on both sides of the clip range
    ratio = torch.exp(logp - old)[mask]
    assert ((ratio < 0.8) | (ratio > 1.2)).any() and ((ratio > 0.8) & (ratio < 1.2)).any()
    return GRPOLoss(lm, shift=shift), PlainInputs((ids, labels, old, torch.tensor([1.0, -0.7])), 2, 16)


@pytest.mark.fast
def test_dpo_logsigmoid_parity():
    """DPO as written in the paper / TRL: -logsigmoid(beta * margin). F.logsigmoid decomposes to
    min(0, x) - log1p(exp(-|x|)), so torch.minimum's backward runs after the streamed head
    (this used to crash AOTAutograd's partitioner on the re-derived joint)."""
    model, inputs = dpo_case("logsigmoid")
    parity(model, inputs, 4)


@pytest.mark.fast
@pytest.mark.heavy
def test_dpo_softplus_parity():
    """The same DPO loss written as softplus(-margin): streams, exact gradients; each sequence's
    token log-prob sum is a "sum" output of the head region, accumulated over chunks."""
    model, inputs = dpo_case("softplus")
    run = parity(model, inputs, 4)
    head = run.programs_named("head")[-1]
    assert SUM in head.out_specs


def test_dpo_head_forward_not_recomputed():
    """One training step runs the head region forward once and backward once (4 chunks each),
    although the loss gradient needs the head's outputs (the per-sequence sums): the forward
    graph saves them rather than the backward re-running the region. (Regression test: the
    re-derived joint once lacked partitioner tags and the default partitioner recomputed the
    whole forward inside the backward.)"""
    model, inputs = dpo_case("softplus")
    run = run_eager_and_compiled(model, inputs, {**EAGER, "head_chunk_size": 4})
    assert run.schedules["head"] == [4, 4], run.schedules


_CALLS = {"n": 0}


@torch.library.custom_op("streamfx_tests::count_calls", mutates_args=())
def count_calls(x: torch.Tensor) -> torch.Tensor:
    """Identity that counts how often it really runs (its fake kernel does not count)."""
    _CALLS["n"] += 1
    return x.clone()


@count_calls.register_fake
def _count_calls_fake(x):
    return torch.empty_like(x)


count_calls.register_autograd(lambda ctx, grad: grad)


@pytest.mark.filterwarnings("ignore:streamfx")  # layer.0 refuses the unknown op: expected
@pytest.mark.parametrize("codegen", [
    "eager",
    "aot_eager-control",
])
def test_trunk_forward_runs_once_per_step(codegen):
    """A counting identity op after the first transformer block must run once per training step
    (forward) -- as with Dynamo's own aot_eager backend -- not again inside the backward
    (regression test for the forward recomputation under the default partitioner)."""
    model, make_inputs = zoo.nanogpt()
    model.transformer.h[0].register_forward_hook(lambda mod, args, out: count_calls(out))
    inputs = make_inputs("b1")
    if codegen == "aot_eager-control":
        compiled = torch.compile(model, backend="aot_eager")
    else:
        compiled = torch.compile(model, backend="streambp", options={"codegen": codegen, "head_chunk_size": 4})
    _CALLS["n"] = 0
    out = compiled(*inputs.args)
    assert _CALLS["n"] == 1
    inputs.loss_of(out).backward()
    assert _CALLS["n"] == 1, "the forward ran again during the backward"


@pytest.mark.fast
def test_grpo_parity():
    model, inputs = grpo_case("labels")
    parity(model, inputs, 4)


HEAD_REFUSAL = "streamfx: region 'head' is not streamed"


def explain_with_warnings(model, inputs, **options):
    """``streamfx.explain`` plus the streamfx warnings it raised; a compile crash is returned, not
    raised, so the head's own refusal (emitted before the rewrite) can be asserted on first."""
    import warnings

    report, crash = None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            report = streamfx.explain(model, *inputs.args, options={"head_chunk_size": 4, **options})
        except torch._dynamo.exc.BackendCompilerFailed as err:
            crash = err
    return report, [str(w.message) for w in caught if "streamfx" in str(w.message)], crash


@pytest.mark.parametrize("case", [pytest.param("dpo-softplus", marks=pytest.mark.extended), "grpo-labels"])
def test_rl_losses_head_planned_by_explain(case):
    """explain() plans the head for DPO (sum of token log-probs per sequence) and GRPO (masked
    per-token objective): no head refusal, one head plan with the requested chunk size."""
    model, inputs = dpo_case("softplus") if case == "dpo-softplus" else grpo_case("labels")
    report, messages, crash = explain_with_warnings(model, inputs)
    assert crash is None, crash
    assert not [m for m in messages if HEAD_REFUSAL in m], messages
    (plan,) = head_plans(report)
    assert (plan.chunk_size, plan.length) == (4, 16)
    assert "head" in str(report)


def test_grpo_logit_shift_streams():
    """The TRL-style shift (logits[:, :-1] against labels[:, 1:]): explain() plans the head on the
    sliced axis (T - 1 tokens) and says the slice was moved in front of it; no refusal."""
    model, inputs = grpo_case("logits")
    report, messages, crash = explain_with_warnings(model, inputs)
    assert crash is None, crash
    assert not [m for m in messages if HEAD_REFUSAL in m], messages
    (plan,) = head_plans(report)
    assert (plan.chunk_size, plan.length) == (4, 15)
    assert plan.nodes[0].op == "call_function" and len(report.moved) == 1
    assert "moved in front of the head" in str(report)


@pytest.mark.parametrize("chunk", [1, 7, 14, 15, 40], ids=["c1", "c7", "cT'-1", "cT'", "c>T'"])
def test_grpo_logit_shift_parity(chunk):
    """GRPO's clipped objective on logits[:, :-1]: the head streams over T' = 15 tokens in
    ceil(15 / chunk) chunks, forward once and backward once, with exact gradients."""
    model, inputs = grpo_case("logits")
    run = run_eager_and_compiled(model, inputs, {**EAGER, "head_chunk_size": chunk})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    n = chunk_count(15, chunk)
    assert_streamed(run, T=15, head_chunk_size=chunk)
    assert run.schedules["head"] == [n] * run.head_passes, run.schedules


class NeighbourLoss(nn.Module):
    """A loss on the difference of neighbouring tokens' logits: token t's term reads token t+1."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        _, logits = self.lm(ids)
        return (logits[:, 1:] - logits[:, :-1]).pow(2).mean()


@pytest.mark.fast
@pytest.mark.filterwarnings("ignore:streamfx")
@pytest.mark.heavy
def test_neighbour_logits_refusal_names_the_slice():
    """Two slices of the logits on different rows mix tokens: the head does not stream, the
    refusal names the slice and its source line, and the gradients stay exact."""
    lm, make_inputs = zoo.tiny_llama()
    inputs = PlainInputs((make_inputs("prompt").args[0],), 2, 16)
    model = NeighbourLoss(lm)
    report = streamfx.explain(model, *inputs.args, options={"head_chunk_size": 4})
    assert head_plans(report) == [] and report.moved == []
    reasons = " ".join(why for _, why in report.not_streamed)
    assert "a slice along the sequence that does not move in front of the head" in reasons
    assert ": aten.slice at " in reasons and "logits[:, 1:] - logits[:, :-1]" in reasons
    run = run_eager_and_compiled(model, inputs, {**EAGER, "head_chunk_size": 4})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert_head_not_streamed(run)


def final_hidden(lm, ids):
    """The tiny Llama's normalised last hidden state, before its LM head."""
    x = lm.embed(ids)
    for layer in lm.layers:
        x = layer(x, lm.cos[:ids.shape[1]], lm.sin[:ids.shape[1]])
    return lm.norm(x)


class TwoTokenLoss(nn.Module):
    """Multi-token prediction: a second head predicts the token after next, its loss weighted in.
    ``shift="logits"`` slices each head's logits by its own offset (``[:, :-1]``, ``[:, :-2]``);
    ``shift="labels"`` shifts the labels instead, padded with -100 (the same loss)."""

    def __init__(self, lm, shift):
        super().__init__()
        self.lm, self.shift = lm, shift
        self.head2 = nn.Linear(lm.lm_head.in_features, lm.vocab, bias=False)

    def forward(self, ids, labels):
        lm = self.lm
        h = final_hidden(lm, ids)
        loss = 0
        for n, head in ((1, lm.lm_head), (2, self.head2)):
            logits = head(h)
            if self.shift == "logits":
                term = F.cross_entropy(logits[:, :-n].reshape(-1, lm.vocab), labels[:, n:].reshape(-1))
            else:
                shifted = F.pad(labels, (0, n), value=-100)[:, n:]
                term = F.cross_entropy(logits.reshape(-1, lm.vocab), shifted.reshape(-1), ignore_index=-100)
            loss = loss + term / n
        return loss


@pytest.mark.fast
@pytest.mark.parametrize("shift", ["logits", "labels"])
def test_losses_shifted_by_two_offsets(shift):
    """Two heads' losses shifted by different offsets: as slices of the logits, each loss streams
    as a head of its own over its run of rows (T - 1 and T - 2 tokens: ceil(15 / 4) and
    ceil(14 / 4) chunks), its slice moved in front of its projection; as shifted labels, one head
    streams both over the T tokens. Exact either way, with no warning."""
    lm, make_inputs = zoo.tiny_llama()
    ids = make_inputs("prompt").args[0]
    labels = torch.randint(0, zoo.VOCAB, ids.shape, generator=torch.Generator().manual_seed(3))
    model = TwoTokenLoss(lm, shift)
    inputs = PlainInputs((ids, labels), 2, 16)
    run = run_eager_and_compiled(model, inputs, {**EAGER, "head_chunk_size": 4})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert run.grads["head2.weight"].abs().sum() > 0
    assert not run.warnings, run.warnings
    if shift == "labels":
        assert set(run.schedules["head"]) == {4} and "head.1" not in run.schedules, run.schedules
        return
    assert {k: set(v) for k, v in run.schedules.items() if k.startswith("head")} == {"head": {4}, "head.1": {4}}, \
        run.schedules
    report = streamfx.explain(model, *inputs.args, options={**EAGER, "head_chunk_size": 4})
    assert [(p.name, p.length) for p in head_plans(report)] == [("head", 15), ("head.1", 14)], report.plan
    assert [(m.start, m.stop) for m in report.moved] == [(0, 15), (0, 14)], report.moved


class DistilledLoss(nn.Module):
    """Knowledge distillation beside a next-token loss: the KL divergence from a teacher's logits
    over ``run`` (every token, or the first T - 2), plus the cross-entropy of ``logits[:, :-1]``;
    ``run="max"``: the largest log-partition function over every token instead of the KL (no sum
    over its run: a map of rows)."""

    def __init__(self, lm, run):
        super().__init__()
        self.lm, self.run = lm, run

    def forward(self, ids, labels, teacher):
        _, logits = self.lm(ids)
        V = logits.shape[-1]
        ce = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].reshape(-1))
        if self.run == "max":
            return ce + 0.1 * torch.logsumexp(logits, -1).amax()
        student, teacher = (logits, teacher) if self.run == "all" else (logits[:, :-2], teacher[:, :-2])
        kl = F.kl_div(F.log_softmax(student, -1), F.log_softmax(teacher, -1), log_target=True, reduction="batchmean")
        return ce + 0.5 * kl


@pytest.mark.parametrize("run_of_kl", [pytest.param("all", marks=pytest.mark.fast),
                                       pytest.param("prefix", marks=pytest.mark.extended), "max"])
def test_a_distillation_term_beside_a_shifted_loss_streams_as_two_heads(run_of_kl):
    """A KL term over every token (or the first T - 2; or the largest log-partition function over
    every token, a map of rows) and a cross-entropy over ``logits[:, :-1]`` read different runs
    of the same logits: two heads, each streamed over its own run (16 or 14 tokens, and 15),
    exact with the gradients computed in the forward or recomputed, and at three lengths in one
    compile (the later ones symbolic). A loss that reads two runs in one value
    (``logits[:, 1:] - logits[:, :-1]``) is refused (``test_neighbour_logits_refusal_names_the_slice``)."""
    lm, make_inputs = zoo.tiny_llama()
    model = DistilledLoss(lm, run_of_kl)
    runs = {"all": [15, 16], "prefix": [14, 15], "max": [15, 16]}[run_of_kl]
    for head_grad in ("auto", "recompute"):
        ids = make_inputs("prompt").args[0]
        g = torch.Generator().manual_seed(5)
        labels = torch.randint(0, zoo.VOCAB, ids.shape, generator=g)
        inputs = PlainInputs((ids, labels, 3 * torch.randn(2, 16, zoo.VOCAB, generator=g)), 2, 16)
        run = run_eager_and_compiled(model, inputs, {**EAGER, "head_chunk_size": 4, "head_grad": head_grad,
                                                     "strict": True})
        torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
        assert_grads_match(run.ref_grads, run.grads)
        assert {k for k in run.schedules if k.startswith("head")} == {"head", "head.1"}, run.schedules
    report = streamfx.explain(model, *inputs.args, options={**EAGER, "head_chunk_size": 4})
    assert sorted(p.length for p in head_plans(report)) == runs, report.plan
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="streambp", options={**EAGER, "head_chunk_size": 4, "strict": True})
    for B, T in [(2, 16), (3, 11), (2, 21)]:
        g = torch.Generator().manual_seed(B * T)
        ids, labels = (torch.randint(0, zoo.VOCAB, (B, T), generator=g) for _ in range(2))
        teacher = 3 * torch.randn(B, T, zoo.VOCAB, generator=g)
        for m in (ref, model):
            m.zero_grad(set_to_none=True)
        ref(ids, labels, teacher).backward()
        with record_schedules() as schedules:
            compiled(ids, labels, teacher).backward()
        assert_grads_match(grads_of(ref), grads_of(model))
        lengths = [T - 1, T - 2] if run_of_kl == "prefix" else [T, T - 1]
        assert sorted(chunk_count(n, 4) for n in lengths) == sorted(schedules[k][0] for k in ("head", "head.1")), \
            (B, T, dict(schedules))


class ClassifiedLM(nn.Module):
    """A next-token loss over ``logits[:, :-1]`` beside a classifier of the first token's hidden
    state (``hidden[:, :1]``, a slice of one row: a pooled token, no sum over the tokens)."""

    def __init__(self, lm, classes=3):
        super().__init__()
        self.lm, self.classifier = lm, nn.Linear(lm.lm_head.in_features, classes)

    def forward(self, ids, labels, target):
        lm = self.lm
        h = final_hidden(lm, ids)
        next_token = F.cross_entropy(lm.lm_head(h)[:, :-1].reshape(-1, lm.vocab), labels[:, 1:].reshape(-1))
        return next_token + F.cross_entropy(self.classifier(h[:, :1]).squeeze(1), target)


@pytest.mark.fast
def test_a_pooled_token_beside_a_shifted_loss_leaves_the_head_to_stream():
    """The classifier's run of rows (the first token) has no sum over the tokens and nothing
    wider than the hidden state: it is no head, and the next-token loss's head streams over its
    T - 1 tokens with its slice moved in front of the LM head, strict and exact."""
    lm, make_inputs = zoo.tiny_llama()
    ids = make_inputs("prompt").args[0]
    labels = torch.randint(0, zoo.VOCAB, ids.shape, generator=torch.Generator().manual_seed(3))
    inputs = PlainInputs((ids, labels, torch.tensor([0, 2])), 2, 16)
    run = run_eager_and_compiled(ClassifiedLM(lm), inputs, {**EAGER, "head_chunk_size": 4, "strict": True})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert run.grads["classifier.weight"].abs().sum() > 0
    assert_streamed(run, T=15, head_chunk_size=4)
    assert [p.name for p in run.programs if p.name.startswith("head")] == ["head"], run.programs


class TRLGRPOLoss(nn.Module):
    """GRPO as TRL's trainer computes it, in plain PyTorch: the model returns logits for the last
    K + 1 positions only (HF's ``logits_to_keep``: a slice of the hidden states), the logits are
    shifted (``[:, :-1]``) and divided by the temperature, ``selective_log_softmax`` takes one
    logsumexp per row, and each sequence's clipped objective is averaged over its completion."""

    def __init__(self, model, temperature=0.7, eps=0.2):
        super().__init__()
        self.model, self.temperature, self.eps = model, temperature, eps

    def per_token_logps(self, input_ids, attention_mask, K):
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=K + 1).logits
        logits = logits[:, :-1, :] / self.temperature
        index = input_ids[:, -K:]
        selected = torch.gather(logits, -1, index.unsqueeze(-1)).squeeze(-1)
        return selected - torch.stack([torch.logsumexp(row, dim=-1) for row in logits])

    def forward(self, input_ids, attention_mask, completion_mask, old_logp, advantages):
        logp = self.per_token_logps(input_ids, attention_mask, completion_mask.shape[1])
        ratio = torch.exp(logp - old_logp)
        adv = advantages.unsqueeze(1)
        obj = torch.min(ratio * adv, torch.clamp(ratio, 1 - self.eps, 1 + self.eps) * adv)
        return -((obj * completion_mask).sum(-1) / completion_mask.sum(-1).clamp(min=1)).mean()


def test_trl_grpo_logits_to_keep_streams():
    """Qwen3 (HF) under TRL's GRPO loss: a left-padded prompt of 6 tokens, K = 10 completion
    tokens (row 0 ends 3 tokens early). HF slices the hidden states to the last K + 1 positions
    (the last layer ends before that slice), the loss slices the logits to the first K of them:
    that slice is moved onto HF's sliced hidden states, and the head streams over the K tokens
    with exact gradients (the per-row logsumexp stack included)."""
    model, _ = zoo.qwen3_sdpa()
    B, T, K = 2, 16, 10
    g = torch.Generator().manual_seed(31)
    ids = torch.randint(1, zoo.VOCAB, (B, T), generator=g)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[1, :2] = 0
    ids = ids.masked_fill(attention_mask == 0, zoo.PAD_ID)
    completion_mask = torch.ones(B, K)
    completion_mask[0, -3:] = 0
    loss = TRLGRPOLoss(model)
    with torch.no_grad():
        logp = loss.per_token_logps(ids, attention_mask, K)
    old = logp + 0.3 * torch.randn(logp.shape, generator=g)
    inputs = PlainInputs((ids, attention_mask, completion_mask, old, torch.tensor([0.8, -1.1])), B, T)
    report = streamfx.explain(loss, *inputs.args, options={"head_chunk_size": 4})
    (plan,) = head_plans(report)
    assert plan.length == K and [(m.start, m.stop, m.length) for m in report.moved] == [(0, K, K + 1)]
    run = parity(loss, inputs, 4, exact_schedule=True, T=K)
    assert run.schedules["head"] == [3] * run.head_passes


def test_logit_shift_graphs_hold_no_whole_sequence_logits(monkeypatch):
    """Walk every graph the rewrite made for the logits[:, :-1] model: the re-derived joint
    (forward and backward) that runs and the head's chunk graphs. Apart from parameter-shaped values (the
    LM head and embedding weights and their gradients), no vocabulary-wide value holds more
    than B x c x V elements: the whole-sequence logits are gone, the moved slice included."""
    from streamfx.passes import pipeline

    joints = []
    stream_joint = pipeline.stream_joint

    def capture(*args, **kwargs):
        out = stream_joint(*args, **kwargs)
        joints.append(out.joint)
        return out

    monkeypatch.setattr(pipeline, "stream_joint", capture)
    model, make_inputs = zoo.tiny_llama_logit_shift()
    inputs = make_inputs("odd13")
    B, T, V, c = inputs.B, inputs.T, inputs.vocab, 4
    run = run_eager_and_compiled(model, inputs, {**EAGER, "head_chunk_size": c})
    assert_streamed(run, T=T - 1, head_chunk_size=c)
    assert joints
    params = {tuple(p.shape) for p in model.parameters()} | {tuple(p.shape)[::-1] for p in model.parameters()}
    # the last joint is the one that runs (the first attempt still had the logits' tangent and
    # was dropped when the backend detached the logits output)
    graphs = [joints[-1].graph] + [at_chunk_size(p.chunk, c).graph for p in run.programs_named("head")]
    checked = 0
    for graph in graphs:
        for n in graph.nodes:
            vals = n.meta.get("val")
            for v in (vals if isinstance(vals, (tuple, list)) else [vals]):
                shape = tuple(int(s) for s in v.shape) if isinstance(v, torch.Tensor) else ()
                if V in shape and shape not in params:
                    assert v.numel() <= B * c * V, (n.name, n.target, shape)
                    checked += 1
    assert checked


def test_logit_shift_return_logits_true():
    """return_logits=True with a shifted loss: the whole-sequence logits come back equal to
    eager's (computed outside the head), the loss still streams over T - 1 tokens."""
    model, make_inputs = zoo.tiny_llama_logit_shift()
    inputs = make_inputs("left_pad")
    run = run_eager_and_compiled(model, inputs, {**EAGER, "head_chunk_size": 4, "return_logits": True})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert_streamed(run, T=inputs.T - 1, head_chunk_size=4)
    logits = inputs.logits_of(run.out)
    assert logits is not None and logits.shape == (inputs.B, inputs.T, inputs.vocab)
    torch.testing.assert_close(logits, inputs.logits_of(run.ref_out).detach(), rtol=1e-5, atol=1e-5)


# ---- bf16 -------------------------------------------------------------------------------------------------
def test_bf16_against_fp32_reference():
    """bf16 model through the backend vs the fp32 model in eager (same initial weights).

    Bound: loss within 2e-2 relative, and per parameter max|g - g_fp32| / max|g_fp32| <= 5e-2
    (bf16 has an 8-bit mantissa, ~4e-3 per rounding; eager bf16 itself lands at ~1e-2 here).
    The compiled bf16 run must also be no worse than 2x eager bf16's own error + 1e-2."""
    model, make_inputs = zoo.tiny_llama()
    inputs = make_inputs("prompt")
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    run = run_eager_and_compiled(bf16, inputs, {**EAGER, "head_chunk_size": 4}, ref_model=model)
    assert_streamed(run, T=inputs.T, head_chunk_size=4)
    assert relative_error(run.loss.float(), run.ref_loss) <= 2e-2
    eager_bf16 = copy.deepcopy(bf16)
    inputs.loss_of(eager_bf16(*inputs.args)).backward()
    for name, ref in run.ref_grads.items():
        got = run.grads[name]
        assert got.dtype == torch.bfloat16
        err = relative_error(got.float(), ref)
        base = relative_error(dict(eager_bf16.named_parameters())[name].grad.float(), ref)
        assert err <= 5e-2, (name, err)
        assert err <= 2 * base + 1e-2, (name, err, base)


class HiddenSliceLlama(zoo.TinyLlama):
    """The head on ``hidden[:, :-1]`` (the shift applied to the hidden state, not the logits)."""

    def forward(self, idx, labels):
        B, T = idx.shape
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, self.cos[:T], self.sin[:T])
        logits = self.lm_head(self.norm(x)[:, :-1])
        return F.cross_entropy(logits.reshape(-1, self.vocab), labels[:, 1:].reshape(-1))


@pytest.mark.fast
@pytest.mark.heavy
def test_hidden_slice_streams_the_last_layer():
    """With one row, ``hidden[:, :-1]`` reaches the head through a view, not a copy (the slice of
    a single row flattens without one): the last layer still ends at the hidden state, every
    layer and the head stream over their own axes, gradients match eager."""
    B = 1
    torch.manual_seed(0)
    model = HiddenSliceLlama().float()
    ids = torch.randint(0, zoo.VOCAB, (B, 16), generator=torch.Generator().manual_seed(5))
    run = parity(model, PlainInputs((ids, ids), B, 16), head_chunk_size=4, T=15)
    assert not [w for w in run.warnings if "not streamed" in w], run.warnings
    assert {p.name for p in run.programs} >= {"layer.0", "layer.1", "head"}, [p.name for p in run.programs]


class LossAndLogps(nn.Module):
    """Returns the loss, the per-token log-probs ([B, T]) and the logits ([B, T, V])."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, labels):
        _, logits = self.lm(ids)
        logp, mask = per_token_logps(logits, labels)
        return -logp.sum() / mask.sum(), logp, logits


def test_per_token_outputs_kept_logits_dropped():
    """With return_logits=False only the vocabulary-wide output is dropped (returned as None):
    the per-token log-probs that leave the head as a graph output are kept, and equal eager's."""
    lm, _ = zoo.tiny_llama()
    ids, _, labels = zoo.tokens(zoo.Case("completion", 2, 16, ignore=(0, 6), seed=21))
    model = LossAndLogps(lm)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="streambp", options={**EAGER, "head_chunk_size": 4})
    loss, logp, logits = compiled(ids, labels)
    ref_loss, ref_logp, _ = ref(ids, labels)
    assert logits is None
    assert logp is not None and logp.shape == ref_logp.shape
    torch.testing.assert_close(logp, ref_logp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)


class MeanTokenLoss(nn.Module):
    """A per-token loss reduced with a mean (plain PyTorch: ``reduction="none"``, then the mean):
    ``form`` "all": over batch and tokens; "per_sequence": over each sequence's tokens, the rows
    weighted and summed; "flat_shifted": the classic shift, flattened, viewed back per sequence
    and averaged per row (kept dims)."""

    def __init__(self, lm, form="all"):
        super().__init__()
        self.lm, self.form = lm, form

    def forward(self, ids, labels):
        _, logits = self.lm(ids)
        if self.form == "flat_shifted":
            V = logits.shape[-1]
            per_token = F.cross_entropy(logits[:, :-1].reshape(-1, V), labels[:, 1:].clamp(min=0).reshape(-1),
                                        reduction="none").view(ids.shape[0], -1)
            return (per_token.mean(-1, keepdim=True) * torch.tensor([[0.5], [2.0]])).sum()
        per_token = F.cross_entropy(logits.transpose(1, 2), labels.clamp(min=0), reduction="none")
        if self.form == "per_sequence":
            return (per_token.mean(1) * torch.tensor([0.5, 2.0])).sum()
        return per_token.mean()


@pytest.mark.fast
@pytest.mark.parametrize("form", ["all", "per_sequence", "flat_shifted"])
@pytest.mark.parametrize("dynamic", [None, pytest.param(True, marks=pytest.mark.extended)])
def test_mean_of_per_token_loss_streams(dynamic, form):
    """A mean is a sum over the sizes it averages: the head streams a loss that is the mean of
    per-token terms, over all of them or over each sequence's (with static and symbolic sizes),
    exactly."""
    lm, make_inputs = zoo.tiny_llama()
    ids, _, labels = zoo.tokens(zoo.Case("mean", 2, 13, pad="left", n_pad=3), zoo.VOCAB)
    model = MeanTokenLoss(lm, form)
    inputs = PlainInputs((ids, labels), 2, 13)
    report = streamfx.explain(model, *inputs.args, options={**EAGER, "head_chunk_size": 4}, dynamic=dynamic)
    assert len(head_plans(report)) == 1 and not report.not_streamed, str(report)
    torch._dynamo.reset()
    run = run_eager_and_compiled(model, inputs, {**EAGER, "head_chunk_size": 4})
    assert run.counters["region_backward"] == zoo.LAYERS + 1 and not run.warnings, (run.counters, run.warnings)
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-6, atol=1e-7)
    assert_grads_match(run.ref_grads, run.grads)
    if dynamic:  # the symbolic compile, run: exact too
        torch._dynamo.reset()
        mine = copy.deepcopy(model)
        compiled = torch.compile(mine, backend="streambp", options={**EAGER, "head_chunk_size": 4}, dynamic=True)
        from streamfx.runtime import COUNTERS

        before = COUNTERS["region_backward"]
        loss = compiled(*inputs.args)
        loss.backward()
        assert COUNTERS["region_backward"] - before == zoo.LAYERS + 1, dict(COUNTERS)
        torch.testing.assert_close(loss.detach(), run.ref_loss, rtol=1e-6, atol=1e-7)
        assert_grads_match(run.ref_grads, {n: p.grad for n, p in mine.named_parameters()})


class WeightedTokenLoss(nn.Module):
    """A per-token loss over the flattened tokens ``[B*T]`` weighted by a tensor made from sizes
    alone over that flat dim: ``form`` "arange" (the flat token index), "linspace" (a ramp from
    0.1 to 1 over every token), "ones_over_n" (``1/n`` at every token: one value)."""

    def __init__(self, lm, form):
        super().__init__()
        self.lm, self.form = lm, form

    def forward(self, ids, labels):
        _, logits = self.lm(ids)
        V = logits.shape[-1]
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        per_token = F.cross_entropy(logits.reshape(-1, V), shifted.reshape(-1), reduction="none")
        n = per_token.numel()
        if self.form == "arange":
            w = torch.arange(n, device=per_token.device).to(per_token.dtype) / n
        elif self.form == "linspace":
            w = torch.linspace(0.1, 1.0, n, device=per_token.device)
        else:
            w = per_token.new_full((n,), 1.0 / n)
        return (per_token * w).sum()


@pytest.mark.fast
@pytest.mark.parametrize("form", ["arange", "linspace", "ones_over_n"])
def test_a_weight_made_over_the_flat_tokens_is_read_per_chunk(form):
    """A tensor made from sizes alone over the flattened tokens holds, at each token, a value of
    where it sits in the whole batch (``arange(B*T)``): the head reads its chunk's rows of it as
    an input (a chunk made again would number its own rows from 0: a wrong loss and gradients,
    silently). One that holds one value everywhere is made per chunk. Exact, streamed."""
    lm, _ = zoo.tiny_llama()
    ids, _, labels = zoo.tokens(zoo.Case("weights", 2, 16, ignore=(2, 6)), zoo.VOCAB)
    run = run_eager_and_compiled(WeightedTokenLoss(lm, form), PlainInputs((ids, labels), 2, 16),
                                 {**EAGER, "chunk_size": 5, "head_chunk_size": 5})
    assert run.counters["region_backward"] == zoo.LAYERS + 1 and not run.warnings, (run.counters, run.warnings)
    assert run.schedules["head"] == [chunk_count(16, 5)] * run.head_passes, run.schedules
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-6, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)


class RowIndexedLoss(nn.Module):
    """The labels' log-probabilities read by an advanced index of each token's row and its label,
    ``logp[arange(n), labels]`` over the flattened tokens (the form many RL losses write)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids, labels):
        _, logits = self.lm(ids)
        V = logits.shape[-1]
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
        logp = torch.log_softmax(logits.reshape(-1, V).float(), -1)
        picked = logp[torch.arange(shifted.numel(), device=logp.device), shifted.clamp(min=0)]
        keep = (shifted != -100).float()
        return -(picked * keep).sum() / keep.sum()


@pytest.mark.fast
def test_labels_read_by_each_tokens_row_index_stream():
    """``logp[arange(n), labels]`` reads one element of each token's own row: the head streams
    it as the per-token gather it is (it ran whole, said to read selected tokens), exactly."""
    lm, _ = zoo.tiny_llama()
    ids, _, labels = zoo.tokens(zoo.Case("rows", 2, 16, ignore=(2, 6)), zoo.VOCAB)
    run = run_eager_and_compiled(RowIndexedLoss(lm), PlainInputs((ids, labels), 2, 16),
                                 {**EAGER, "chunk_size": 5, "head_chunk_size": 5, "strict": True})
    assert run.counters["region_backward"] == zoo.LAYERS + 1 and not run.warnings, (run.counters, run.warnings)
    assert run.schedules["head"] == [chunk_count(16, 5)] * run.head_passes, run.schedules
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-6, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)


@pytest.mark.fast
@pytest.mark.heavy
def test_a_weight_made_over_the_flat_tokens_streams_at_symbolic_sizes():
    """``arange(n) / n`` over the flattened tokens with ``n`` symbolic: the weight (a symbolic
    size read as a value, the whole batch's) is computed outside the head and read per chunk; the
    head streams at every length of one compile, exactly."""
    from streamfx.runtime import COUNTERS

    lm, _ = zoo.tiny_llama()
    model = WeightedTokenLoss(lm, "arange")
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="streambp", options={**EAGER, "chunk_size": 5, "head_chunk_size": 5},
                             dynamic=True)
    for T in (16, 11):
        ids, _, labels = zoo.tokens(zoo.Case("weights", 2, T, seed=T), zoo.VOCAB)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        before = COUNTERS["region_backward"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled(ids, labels).backward()
        assert not [w for w in caught if "streamfx" in str(w.message)], [str(w.message) for w in caught]
        assert COUNTERS["region_backward"] - before == zoo.LAYERS + 1, dict(COUNTERS)
        ref(ids, labels).backward()
        assert_grads_match({n: p.grad for n, p in ref.named_parameters()},
                           {n: p.grad for n, p in model.named_parameters()})


class PerTokenValues(nn.Module):
    """Per-token values computed from the logits that leave the graph before any sum over the
    tokens: ``form`` "masked" (per-token losses, then ``per[mask].mean()``: a boolean index, a
    graph break after them), "logps" (the targets' log-probabilities and the entropy returned, the
    loss computed by the caller, as an RL trainer's compiled log-prob function), "flat" (per-token
    losses over the flattened tokens ``[B*T]`` returned), "piece" (the log-probs in a graph of
    their own after a graph break between the layers and the LM head)."""

    def __init__(self, lm, form):
        super().__init__()
        self.lm, self.form = lm, form

    def forward(self, ids, labels):
        if self.form == "piece":
            lm, T = self.lm, ids.shape[1]
            x = lm.embed(ids)
            for layer in lm.layers:
                x = layer(x, lm.cos[:T], lm.sin[:T])
            torch._dynamo.graph_break()
            logits = lm.lm_head(lm.norm(x))
        else:
            _, logits = self.lm(ids)
        V = logits.shape[-1]
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        if self.form in ("logps", "piece"):
            logp = torch.log_softmax(logits.float(), -1)
            picked = torch.gather(logp, -1, shifted.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            return picked, -(logp.exp() * logp).sum(-1)
        per_token = F.cross_entropy(logits.reshape(-1, V), shifted.reshape(-1), reduction="none")
        if self.form == "flat":
            return per_token
        keep = shifted.reshape(-1) != -100
        return per_token[keep].mean()


def _weighted(out):
    """A loss over returned per-token values, with a different weight at every token."""
    out = out if isinstance(out, tuple) else (out,)
    return sum((x * torch.linspace(0.5, 1.5, x.numel()).view(x.shape)).sum() for x in out)


@pytest.mark.fast
@pytest.mark.parametrize("form", ["masked", "logps", "piece", pytest.param("flat", marks=pytest.mark.extended)])
def test_per_token_values_that_leave_before_their_sum_stream_as_rows(form):
    """A head whose per-token values leave the graph before their sum (nothing in the graph sums
    over the tokens) streams as a map of rows: each chunk computes its logits and writes its rows
    of the narrow values, the backward recomputes a chunk with its rows' gradients. The logits
    never exist whole (they did, with a warning that the head computes no loss); exact, strict."""
    lm, _ = zoo.tiny_llama()
    ids, _, labels = zoo.tokens(zoo.Case("rows", 2, 16, ignore=(2, 6)), zoo.VOCAB)
    inputs = PlainInputs((ids, labels), 2, 16)
    inputs.loss_of = _weighted
    run = run_eager_and_compiled(PerTokenValues(lm, form), inputs,
                                 {**EAGER, "chunk_size": 5, "head_chunk_size": 5, "strict": True})
    assert run.counters["region_backward"] == zoo.LAYERS + 1 and not run.warnings, (run.counters, run.warnings)
    assert run.schedules["head"] == [chunk_count(16, 5)] * run.head_passes, run.schedules
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert all(h.seeds is None and SUM not in h.out_specs for h in run.programs_named("head")), run.programs


@pytest.mark.fast
def test_per_token_values_beside_the_logits_they_come_from_are_refused():
    """Where the logits leave the graph too (or ``logits[:, -1]``), they exist whole whatever the
    head does: it runs whole, exactly, with the warning that says so."""

    class Beside(nn.Module):
        def __init__(self, lm, last):
            super().__init__()
            self.lm, self.last = lm, last

        def forward(self, ids, labels):
            _, logits = self.lm(ids)
            top = torch.log_softmax(logits, -1).amax(-1)
            return top, (logits[:, -1] if self.last else logits)

    ids, _, labels = zoo.tokens(zoo.Case("rows", 2, 16), zoo.VOCAB)
    for last, cause in ((False, "the logits leave the graph whole"), (True, "reads selected tokens")):
        lm, _ = zoo.tiny_llama()
        inputs = PlainInputs((ids, labels), 2, 16)
        inputs.loss_of = _weighted
        run = run_eager_and_compiled(Beside(lm, last), inputs, {**EAGER, "chunk_size": 5, "head_chunk_size": 5})
        assert "head" not in run.schedules and len(run.warnings) == 1 and cause in run.warnings[0], run.warnings
        assert_grads_match(run.ref_grads, run.grads)


class OverTokenLosses(nn.Module):
    """A loss over the per-token losses that is not a sum of per-token terms: ``form`` "max" (the
    largest loss of each sequence), "topk" (the mean of each sequence's hardest half, as token
    selection by loss writes it), "returns" (a reverse cumulative sum over the tokens), "std"
    (their spread), "sort", "logsumexp" (a soft maximum over the tokens)."""

    def __init__(self, lm, form):
        super().__init__()
        self.lm, self.form = lm, form

    def forward(self, ids, labels):
        _, logits = self.lm(ids)
        T = logits.shape[1]
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        valid = shifted != -100
        per = F.cross_entropy(logits.transpose(1, 2).float(), shifted, reduction="none").masked_fill(~valid, 0)
        if self.form == "max":
            return per.amax(-1).mean() + per.sum() / valid.sum()
        if self.form == "topk":
            return per.topk(T // 2, dim=-1).values.mean()
        if self.form == "returns":
            return per.flip(-1).cumsum(-1).flip(-1).mean()
        if self.form == "std":
            return per.std(-1).mean()
        if self.form == "sort":
            return torch.sort(per, dim=-1, descending=True).values[:, :4].mean()
        return torch.logsumexp(per, -1).mean()


@pytest.mark.fast
@pytest.mark.parametrize("form", ["max", "topk", "returns", "std", pytest.param("sort", marks=pytest.mark.extended),
                                  pytest.param("logsumexp", marks=pytest.mark.extended)])
def test_a_loss_over_the_per_token_losses_that_is_not_their_sum_streams_their_rows(form):
    """Where the head's sums over the tokens do not stream (a maximum, a top-k or a cumulative
    sum over the per-token losses reads them all), the head streams as a map of rows up to the
    per-token losses, and what follows reads them whole ([B, T], no wider than the hidden state):
    the logits never exist whole (they did, with a warning naming the reduction); exact, strict."""
    lm, _ = zoo.tiny_llama()
    ids, _, labels = zoo.tokens(zoo.Case("rows", 2, 16, ignore=(2, 6)), zoo.VOCAB)
    run = run_eager_and_compiled(OverTokenLosses(lm, form), PlainInputs((ids, labels), 2, 16),
                                 {**EAGER, "chunk_size": 5, "head_chunk_size": 5, "strict": True})
    assert run.counters["region_backward"] == zoo.LAYERS + 1 and not run.warnings, (run.counters, run.warnings)
    assert run.schedules["head"] == [chunk_count(16, 5)] * run.head_passes, run.schedules
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert all(SUM not in h.out_specs for h in run.programs_named("head")), run.programs
    if form == "max":   # explain() says how the head streams and why its sums do not
        report = streamfx.explain(OverTokenLosses(copy.deepcopy(lm), form), ids, labels,
                                  options={**EAGER, "head_chunk_size": 5})
        (line,) = [ln for ln in str(report).splitlines() if ln.strip().startswith("head (lm.lm_head): 4 chunk")]
        assert "a map of rows" in line and "not a sum: aten.amax at" in line and "test_head_streaming.py" in line, line


def hardest_half(logits, labels, vocab_size, **kwargs):
    """A Hugging Face ``loss_function``: the mean of each sequence's hardest half of the tokens."""
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
    per = F.cross_entropy(logits.float().transpose(1, 2), shifted, reduction="none")
    return per.topk(per.shape[1] // 2, dim=-1).values.mean()


@pytest.mark.fast
def test_a_models_own_loss_that_is_not_a_sum_streams_its_rows_and_drops_the_logits():
    """A Hugging Face model whose ``loss_function`` is not a sum over the tokens returns its
    logits beside the loss: as for a loss that sums, the head streams (as a map of rows here)
    and the logits are dropped (None; ``return_logits=True`` keeps them). Exact, strict."""
    model, make_inputs = zoo.qwen3_sdpa()
    model.loss_function = hardest_half
    run = run_eager_and_compiled(model, make_inputs("left_pad"),
                                 {**EAGER, "chunk_size": 5, "head_chunk_size": 5, "strict": True})
    assert run.counters["region_backward"] == zoo.LAYERS + 1 and not run.warnings, (run.counters, run.warnings)
    assert run.out.logits is None and run.ref_out.logits is not None, "the logits should be dropped"
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)


# ---- the head's gradient in the forward pass (head_grad) ------------------------------------------
HEAD_GRAD_CASES = {
    "mean": lambda: (lambda m, mk: (m, mk("prompt")))(*zoo.nanogpt()),
    "dpo": lambda: dpo_case("softplus"),
    "grpo": lambda: grpo_case("logits"),
}


@pytest.mark.fast
@pytest.mark.parametrize("mode", ["forward", "recompute"])
@pytest.mark.parametrize("case", sorted(HEAD_GRAD_CASES))
def test_head_grad_modes(case, mode):
    """head_grad="forward": each chunk's gradients of the head's loss values are computed right
    after its forward and kept (the backward only scales them; one pass over the chunks);
    "recompute": the backward reruns each chunk. Both exact for a mean loss, DPO's per-row sums
    (4 values) and GRPO's objective; "forward" keeps no input of the head for its backward."""
    model, inputs = HEAD_GRAD_CASES[case]()
    T = 15 if case == "grpo" else inputs.T
    run = parity(model, inputs, 4, T=T, head_grad=mode)
    head = run.programs_named("head")[-1]
    n = chunk_count(T, 4)
    if mode == "forward":
        assert head.seeds is not None and run.schedules["head"] == [n], (head.seeds, run.schedules)
    else:
        assert head.seeds is None and run.schedules["head"] == [n, n], run.schedules


@pytest.mark.fast
@pytest.mark.heavy
def test_head_grad_auto_is_forward_for_one_loss_value_only():
    """head_grad="auto" (the default) computes the gradient in the forward where one value carries
    it (a scalar loss: one backward per chunk, no recompute), and recomputes where several do
    (DPO's per-row sums: one backward per value per chunk would cost more than a recompute)."""
    model, mk = zoo.nanogpt()
    report = streamfx.explain(model, *mk("prompt").args, options={**EAGER, "head_chunk_size": 4})
    (plan,) = head_plans(report)
    assert plan.seeds == ((0, 0),) and "in the forward" in str(report), plan.seeds
    model, inputs = dpo_case("softplus")
    (plan,) = head_plans(streamfx.explain(model, *inputs.args, options={**EAGER, "head_chunk_size": 4}))
    assert plan.seeds is None


@pytest.mark.fast
def test_head_grad_twice_with_retain_graph():
    """A second backward through the same step (retain_graph=True, here of half the loss) scales
    the kept gradients again: every gradient sums both, as eager autograd's does."""
    model, mk = zoo.nanogpt()
    inputs = mk("prompt")
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="streambp", options={**EAGER, "head_chunk_size": 4})
    for m in (ref, compiled):
        loss = inputs.loss_of(m(*inputs.args, **inputs.kwargs))
        loss.backward(retain_graph=True)
        (loss * 0.5).backward()
    assert_grads_match({n: p.grad for n, p in ref.named_parameters()},
                       {n: p.grad for n, p in model.named_parameters()}, rtol=1e-5)


@pytest.mark.fast
def test_head_grad_option_is_checked():
    with pytest.raises(streamfx.StreamBPError, match="'auto', 'forward', 'recompute'"):
        streamfx.StreamConfig(head_grad="fused")


class _FlatTokenLossLM(nn.Module):
    """Returns the mean loss and the per-token losses flattened over the batch and tokens
    (``cross_entropy(..., reduction="none")`` on ``[B*T, V]``: a ``[B*T]`` output)."""

    def __init__(self, vocab=zoo.VOCAB, d=16):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.mix, self.head = nn.Embedding(vocab, d), nn.Linear(d, d), nn.Linear(d, vocab)

    def forward(self, idx, labels):
        h = self.emb(idx)
        h = h + torch.tanh(self.mix(h))
        tokens = F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten(), reduction="none")
        return tokens.mean(), tokens


@pytest.mark.fast
@pytest.mark.parametrize("B", [1, 3])
def test_per_token_losses_flattened_over_the_batch_stream(B):
    """A per-token output laid out batch x tokens as one dim leaves the head row by row: each
    chunk's ``[B*c]`` values go to rows [s, e) of every batch row, and its gradient is read the
    same way. The caller weighs every token (so the flattened output gets a gradient of its own):
    loss and gradients equal eager's, the head streamed (chunks of 7 over 20 tokens), strict."""
    idx, labels = torch.randint(0, zoo.VOCAB, (B, 20)), torch.randint(0, zoo.VOCAB, (B, 20))
    weights = torch.rand(B * 20)
    model = _FlatTokenLossLM()
    ref = copy.deepcopy(model)
    mean, tokens = ref(idx, labels)
    (mean + (tokens * weights).sum()).backward()
    compiled = torch.compile(model, backend="streambp", options={**EAGER, "head_chunk_size": 7, "strict": True})
    before = dict(streamfx.runtime.COUNTERS)
    got_mean, got_tokens = compiled(idx, labels)
    (got_mean + (got_tokens * weights).sum()).backward()
    ran = {k: streamfx.runtime.COUNTERS[k] - before.get(k, 0) for k in ("region_forward", "chunks_forward")}
    assert ran == {"region_forward": 1, "chunks_forward": 3}, ran   # (the head, in chunks of 7, 7, 6)
    torch.testing.assert_close(got_tokens, tokens.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_mean, mean.detach(), rtol=1e-5, atol=1e-6)
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-5, atol=1e-6, msg=name)


class ScalarItems(zoo.TinyLlama):
    """TinyLlama whose layers and logits are scaled by the items of one parameter
    (``scale.unbind(0)``): the head reads a 0-dim item as an input, and the items' gradients
    meet again in the backward of ``unbind`` (a stack of 0-dim gradients)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([0.7, 1.3]))

    def forward(self, idx, labels=None):
        T = idx.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed(idx)
        a, b = self.scale.unbind(0)
        for layer in self.layers:
            x = layer(x * a, cos, sin) * b
        logits = self.lm_head(self.norm(x)) * a
        shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
        return F.cross_entropy(logits.reshape(-1, self.vocab), shifted.reshape(-1), ignore_index=-100), None


@pytest.mark.fast
def test_a_head_that_keeps_its_seed_gradients_gives_a_0_dim_input_a_0_dim_gradient():
    """The head computes its loss's gradients in the forward (one seed) and scales them in the
    backward by the incoming one-element gradient: a 0-dim input's gradient stays 0-dim, so the
    graph's ``unbind`` backward stacks it with its sibling's, and the gradients match eager."""
    torch.manual_seed(0)
    model = ScalarItems()
    inputs = zoo._plain_inputs(zoo.VOCAB)(zoo.Case("t", 2, 13))
    run = run_eager_and_compiled(model, inputs, {"codegen": "eager", "chunk_size": 5})
    assert {p.name for p in run.programs} == {"layer.0", "layer.1", "head"}, run.warnings
    assert [p.seeds for p in run.programs if p.name == "head"] == [((0, 0),)]
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)


class DistillationLoss(nn.Module):
    """Knowledge distillation at a temperature: KL(teacher || student) of the softened
    distributions over every token, scaled by t^2 (the teacher's logits are an input)."""

    def __init__(self, lm, temperature=2.0):
        super().__init__()
        self.lm, self.t = lm, temperature

    def forward(self, ids, teacher_logits):
        _, logits = self.lm(ids)
        student = F.log_softmax(logits / self.t, dim=-1)
        teacher = F.log_softmax(teacher_logits / self.t, dim=-1)
        return F.kl_div(student, teacher, reduction="batchmean", log_target=True) * self.t ** 2


def temperature_case(form):
    if form == "distillation":
        lm, make_inputs = zoo.tiny_llama()
        ids = make_inputs("prompt").args[0]
        teacher = torch.randn(*ids.shape, zoo.VOCAB, generator=torch.Generator().manual_seed(41))
        return DistillationLoss(lm), PlainInputs((ids, teacher), *ids.shape), ids.shape[1]
    model, _ = zoo.qwen3_sdpa()
    B, T, K = 2, 16, 10
    g = torch.Generator().manual_seed(42)
    ids = torch.randint(1, zoo.VOCAB, (B, T), generator=g)
    mask, completion = torch.ones(B, T, dtype=torch.long), torch.ones(B, K)
    loss = TRLGRPOLoss(model)
    with torch.no_grad():
        old = loss.per_token_logps(ids, mask, K) + 0.3 * torch.randn(B, K, generator=g)
    return loss, PlainInputs((ids, mask, completion, old, torch.tensor([0.8, -1.1])), B, T), K


def joint_structure(gm) -> Counter:
    """A graph's ops, each with the ops of its inputs: equal for the same graph traced twice."""
    def name(n):
        return n.op if n.op != "call_function" else str(n.target)
    return Counter((name(n), tuple(sorted(name(a) for a in n.all_input_nodes))) for n in gm.graph.nodes)


@pytest.mark.parametrize("form", ["distillation", "trl-grpo"])
def test_losses_at_a_temperature_stream_as_inductor_compiles_them(form, monkeypatch):
    """Logits over a temperature under Inductor's codegen: its joint-graph passes rewrite the
    softmax of the scaled logits (scale after subtracting the maximum, guarded by an
    ``all(isfinite(x / t))`` over the vocabulary on torch 2.13, a reduction the head computes per
    token). The head streams with exact gradients, and ``explain`` analyses the same joint graph
    as the compile (it had analysed the graph before those passes, and said the head streamed
    when the compile refused it)."""
    from streamfx.passes import pipeline

    model, inputs, T = temperature_case(form)
    joints = []
    analyse = pipeline.run

    def spy(joint, *args, **kwargs):
        joints.append(joint_structure(joint))
        return analyse(joint, *args, **kwargs)

    monkeypatch.setattr(pipeline, "run", spy)
    run = run_eager_and_compiled(model, inputs, {"codegen": "inductor", "head_chunk_size": 4})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert not [m for m in run.warnings if HEAD_REFUSAL in m], run.warnings
    assert_streamed(run, T=T, head_chunk_size=4)
    compiled = joints[-1]
    report = streamfx.explain(model, *inputs.args, options={"head_chunk_size": 4})
    assert joints[-1] == compiled, (joints[-1] - compiled, compiled - joints[-1])
    (plan,) = head_plans(report)
    assert plan.length == T
