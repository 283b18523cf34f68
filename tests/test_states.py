"""Never silently wrong, in every training state: gradient-mode changes, learned mask and score
parameters, bf16 and autocast, inputs_embeds, use_cache, warnings per compiled graph.

Every call is compared with eager autograd on the same weights and inputs.
"""
import contextlib
import copy
import importlib
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, strategies as st

import streamfx
import zoo
from conftest import assert_grads_match, grads_of, relative_error, run_eager_and_compiled
from streamfx.runtime import COUNTERS
from tiers import cases, compiling


def _streamfx_warnings(caught) -> list:
    return [str(w.message) for w in caught if "streamfx" in str(w.message)]


def _set_trainable(model, predicate) -> None:
    for name, p in model.named_parameters():
        p.requires_grad_(predicate(name))


# ---- gradient-mode changes ---------------------------------------------------------------------
@pytest.mark.parametrize("order", cases(["freeze_then_unfreeze", "unfreeze_then_freeze"], ["unfreeze_then_freeze"]))
def test_frozen_then_trainable_layers_get_their_gradients_inductor(order):
    """Compiled chunk code depends on which inputs get a gradient: a step with the layers frozen
    and then one with everything trainable (staged fine-tuning) must not reuse the code compiled
    for the frozen step (it would return no gradient for the layer weights)."""
    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs("left_pad")
    ref, mine = copy.deepcopy(model), copy.deepcopy(model)
    compiled = torch.compile(mine, backend="streambp", options={"codegen": "inductor", "chunk_size": 5})

    states = [True, False] if order == "freeze_then_unfreeze" else [False, True]
    for frozen in states:
        for m in (ref, mine):
            _set_trainable(m, lambda n: not (frozen and ".layers." in n))
            m.zero_grad(set_to_none=True)
        before = COUNTERS["region_backward"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            inputs.loss_of(compiled(*inputs.args, **inputs.kwargs)).backward()
        inputs.loss_of(ref(*inputs.args, **inputs.kwargs)).backward()
        # (torch < 2.13 calls the graph compiled for the frozen step again, pytorch/pytorch#139476:
        # the backend then compiles it again for the gradients; torch 2.13's Dynamo does)
        assert not _streamfx_warnings(caught), _streamfx_warnings(caught)
        assert COUNTERS["region_backward"] - before == zoo.LAYERS + 1
        assert_grads_match(grads_of(ref), grads_of(mine))
        if not frozen:
            assert grads_of(mine)["model.layers.0.self_attn.q_proj.weight"].abs().max() > 0


# ---- learned parameters in the mask and score path -----------------------------------------------
class ScoreParamAttention(nn.Module):
    """Unfused causal attention whose scores carry a learned parameter: a dense [H, T, T] bias,
    per-head ALiBi slopes, or a temperature."""

    def __init__(self, kind, d=32, heads=4, max_len=64):
        super().__init__()
        self.kind, self.heads = kind, heads
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.bias = nn.Parameter(torch.randn(heads, max_len, max_len) * 0.1)
        self.slopes = nn.Parameter(torch.rand(heads) * 0.5)
        self.temperature = nn.Parameter(torch.tensor(1.3))

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (D // self.heads) ** 0.5
        pos = torch.arange(T, device=x.device)
        if self.kind == "dense":
            scores = scores + self.bias[:, :T, :T]
        elif self.kind == "slopes":
            scores = scores + self.slopes.view(1, -1, 1, 1) * (pos[None, :] - pos[:, None]).float()
        else:
            scores = scores * self.temperature
        scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


class ScoreParamModel(nn.Module):
    def __init__(self, kind, vocab=50, d=32, layers=2, flip=False):
        super().__init__()
        self.flip = flip
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(ScoreParamAttention(kind, d) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, ids, labels):
        h = self.embed(ids)
        for block in self.blocks:
            h = h + block(F.layer_norm(h, h.shape[-1:]))
            if self.flip:  # every token reads the last ones: nothing streams
                h = h + 0.1 * h.flip(1)
        return F.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


@pytest.mark.fast
@pytest.mark.parametrize("kind", ["dense", "slopes", "temperature"])
def test_learned_score_parameters_get_their_gradient(kind):
    """A learned bias, slope or temperature in the scores gets its true gradient: streamed (the
    bias enters each chunk's scores and its gradient accumulates over chunks) or, where the layer
    does not stream, with a warning; never zero."""
    torch.manual_seed(0)
    model = ScoreParamModel(kind)
    ids, labels = torch.randint(0, 50, (2, 16)), torch.randint(0, 50, (2, 16))
    ref = copy.deepcopy(model)
    ref(ids, labels).backward()
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "chunk_size": 4})
    before = COUNTERS["region_backward"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(ids, labels).backward()
    streamed = COUNTERS["region_backward"] - before
    errors = assert_grads_match(grads_of(ref), grads_of(model))
    learned = {"dense": "bias", "slopes": "slopes", "temperature": "temperature"}[kind]
    for i in range(2):
        assert model.blocks[i].__getattr__(learned).grad.abs().max() > 0, errors
    # the masked_fill condition is the mask; the learned term is a score term, whatever the order
    # in which the graph holds them
    assert streamed == 3 and not _streamfx_warnings(caught), (streamed, _streamfx_warnings(caught))


class TwoMaskAttention(ScoreParamAttention):
    """Causal attention masked twice: a causal masked_fill and a padding mask added to the scores."""

    def forward(self, x, pad):
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (D // self.heads) ** 0.5
        pos = torch.arange(T, device=x.device)
        scores = scores + torch.where(pad[:, None, None, :] & pad[:, None, :, None], 0.0, torch.finfo(x.dtype).min)
        scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D))


@pytest.mark.fast
def test_two_masks_on_the_scores_compose_and_stream():
    """A padding mask added beside a causal masked_fill: masks applied in sequence are read as one
    (their effect on zero scores), so the layer streams (strict: no refusal), exactly."""
    torch.manual_seed(0)
    block = TwoMaskAttention("dense")
    x = torch.randn(2, 12, 32)
    pad = torch.ones(2, 12, dtype=torch.bool)
    pad[0, :3] = False
    ref = copy.deepcopy(block)
    (ref(x, pad) * torch.arange(12.0)[None, :, None]).nan_to_num().sum().backward()
    compiled = torch.compile(block, backend="streambp", options={"codegen": "eager", "chunk_size": 4, "strict": True})
    before = COUNTERS["chunks_backward"]
    (compiled(x, pad) * torch.arange(12.0)[None, :, None]).nan_to_num().sum().backward()
    assert COUNTERS["chunks_backward"] - before == 3  # T=12 in chunks of 4
    assert_grads_match(grads_of(ref), grads_of(block))


# ---- dtypes ----------------------------------------------------------------------------------------
def _bf16_error(model, inputs, state: str, compile_it: bool, chunk_size: int = 5):
    """(loss, grads) relative errors of a bf16 run (model cast, or fp32 under autocast) against
    the fp32 eager reference."""
    ref = copy.deepcopy(model)
    ref_loss = inputs.loss_of(ref(*inputs.args, **inputs.kwargs))
    ref_loss.backward()
    mine = copy.deepcopy(model)
    if state == "bf16":
        mine = mine.to(torch.bfloat16)
        ctx = contextlib.nullcontext()
    else:
        ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    run = torch.compile(mine, backend="streambp", options={"codegen": "eager", "chunk_size": chunk_size}) \
        if compile_it else mine
    before = COUNTERS["region_backward"]
    with ctx:
        loss = inputs.loss_of(run(*inputs.args, **inputs.kwargs))
    loss.backward()
    g, r = grads_of(mine), grads_of(ref)
    err = max(relative_error(g[n].float(), r[n]) for n in r if r[n] is not None)
    return relative_error(loss.float(), ref_loss), err, COUNTERS["region_backward"] - before


# every zoo model in one of the two states, each state on four models (alternating)
LOW_PRECISION = [(name, ("bf16", "autocast")[i % 2]) for i, name in enumerate(
    ["qwen3_sdpa", "qwen3_eager", "llama_tied", "mistral_sliding", "gemma3", "gpt2", "nanogpt", "tiny_llama"])]
# the default run: two models in each state, of different forms (the rest: extended)
LOW_PRECISION_DEFAULT = ("qwen3_sdpa", "mistral_sliding", "gpt2", "nanogpt")


@pytest.mark.parametrize("name, state", cases(LOW_PRECISION, [p for p in LOW_PRECISION if p[0] in LOW_PRECISION_DEFAULT]),
                         ids=[f"{n}-{s}" for n, s in LOW_PRECISION])
def test_bf16_and_autocast_stream_within_eager_bf16_error(name, state):
    """bf16 models and fp32 models under autocast compile and stream every layer and the head;
    their error against an fp32 eager reference is within the error eager bf16 itself has
    (measured here, on the same weights and inputs)."""
    model, make_inputs = zoo.ZOO[name]()
    if name == "gpt2":
        model.loss_type = "ForCausalLM"  # (GPT-2's config names no loss type: the graph breaks before it)
    inputs = make_inputs("left_pad" if name not in ("nanogpt", "tiny_llama") else "b1")
    eager_loss, eager_grad, _ = _bf16_error(model, inputs, state, compile_it=False)
    loss, grad, streamed = _bf16_error(model, inputs, state, compile_it=True)
    assert streamed == zoo.LAYERS + 1, streamed
    assert loss <= 2 * eager_loss + 1e-3, (loss, eager_loss)
    assert grad <= 2 * eager_grad + 1e-2, (grad, eager_grad)


def _two_graphs_reverse(model, make_inputs):
    """Two forwards of different lengths alive at once, their backwards in reverse order (the
    later one scaled): one autograd graph's region state must not reach the other's."""
    model.zero_grad(set_to_none=True)
    first = model(**make_inputs("right_pad").kwargs).loss
    second = model(**make_inputs("odd13").kwargs).loss
    (3 * second).backward()
    first.backward()
    return torch.stack([first.detach(), second.detach()]).double(), \
        {k.removeprefix("_orig_mod."): g.double() for k, g in grads_of(model).items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_step_graphs_alive_backward_in_reverse_order(dtype):
    """fp32: equal to eager. bf16 (its weights' gradients summed in shared fp32 buffers): within
    the error eager bf16 has against float64, measured on the same weights and inputs."""
    model, make_inputs = zoo.qwen3()
    before = dict(COUNTERS)
    compiled = torch.compile(copy.deepcopy(model).to(dtype), backend="streambp",
                             options={"codegen": "eager", "chunk_size": 5, "head_chunk_size": 4})
    loss, grads = _two_graphs_reverse(compiled, make_inputs)
    assert COUNTERS["region_backward"] - before.get("region_backward", 0) == 2 * (zoo.LAYERS + 1)
    if dtype == torch.float32:
        ref_loss, ref_grads = _two_graphs_reverse(copy.deepcopy(model), make_inputs)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        assert_grads_match(ref_grads, grads, rtol=1e-5)
        return
    exact_loss, exact = _two_graphs_reverse(copy.deepcopy(model).double(), make_inputs)
    eager_loss, eager = _two_graphs_reverse(copy.deepcopy(model).to(dtype), make_inputs)
    for name, g in exact.items():
        assert relative_error(grads[name], g) <= 2 * relative_error(eager[name], g) + 1e-2, name
    assert relative_error(loss, exact_loss) <= 2 * relative_error(eager_loss, exact_loss) + 1e-3


@pytest.mark.parametrize("name", ["qwen3_sdpa", "llama_tied"])
def test_bf16_regions_of_one_chunk_stream_within_eager_bf16_error(name):
    """A bf16 layer run as one chunk returns its weights' gradients in bf16 as autograd made them
    (no fp32 sum: ``runtime._sum_into(late=True)``); every layer and the head stream, within the
    error eager bf16 itself has."""
    model, make_inputs = zoo.ZOO[name]()
    inputs = make_inputs("left_pad")
    eager_loss, eager_grad, _ = _bf16_error(model, inputs, "bf16", compile_it=False)
    loss, grad, streamed = _bf16_error(model, inputs, "bf16", compile_it=True, chunk_size=64)
    assert streamed == zoo.LAYERS + 1, streamed
    assert loss <= 2 * eager_loss + 1e-3, (loss, eager_loss)
    assert grad <= 2 * eager_grad + 1e-2, (grad, eager_grad)


@pytest.mark.parametrize("name, case", cases([("qwen3_sdpa", "left_pad"), ("mistral_sliding", "right_pad")], [("mistral_sliding", "right_pad")]))
def test_bf16_row_gradients_in_their_dtype_are_the_bits_of_fp32_buffers(name, case, monkeypatch):
    """A bf16 layer gathers its per-token inputs' gradients in bf16 buffers (each element gets at
    most two gradients: ``runtime._row_grad_dtype``): the gradients are bit for bit those of fp32
    buffers cast at the end, over several chunks, under padding, with a sliding window (chunks
    that read keys before their own rows)."""
    from streamfx import runtime

    model, make_inputs = zoo.ZOO[name]()
    model = model.to(torch.bfloat16)
    inputs = make_inputs(case)

    def grads(row_dtype):
        monkeypatch.setattr(runtime, "_row_grad_dtype", row_dtype)
        torch._dynamo.reset()
        mine = copy.deepcopy(model)
        run = torch.compile(mine, backend="streambp", options={"codegen": "eager", "chunk_size": 3})
        before = COUNTERS["chunks_backward"]
        inputs.loss_of(run(*inputs.args, **inputs.kwargs)).backward()
        assert COUNTERS["chunks_backward"] - before >= zoo.LAYERS * 3
        return grads_of(mine)

    own, fp32 = grads(runtime._row_grad_dtype), grads(lambda spec, x: runtime._acc_dtype(x))
    assert own.keys() == fp32.keys()
    for n in own:
        assert (own[n] is None) == (fp32[n] is None) and (own[n] is None or torch.equal(own[n], fp32[n])), n


# ---- inputs ----------------------------------------------------------------------------------------
@pytest.mark.fast
def test_inputs_embeds_streams():
    """The residual stream may start at a graph input: a model called with inputs_embeds
    (multimodal models, soft prompts) streams every layer and the head."""
    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs("left_pad")
    kwargs = dict(inputs.kwargs)
    with torch.no_grad():
        kwargs["inputs_embeds"] = model.model.embed_tokens(kwargs.pop("input_ids"))
    run = run_eager_and_compiled(model, zoo.Inputs((), kwargs, inputs.case, inputs.loss_of, inputs.logits_of,
                                                   inputs.vocab), {"chunk_size": 5})
    assert_grads_match(run.ref_grads, run.grads)
    assert not run.warnings, run.warnings
    assert run.counters["region_backward"] == zoo.LAYERS + 1


@pytest.mark.fast
@pytest.mark.heavy
def test_output_attentions_runs_the_layers_whole_and_says_why():
    """output_attentions=True (eager attention) makes each layer's [B, H, T, T] probabilities an
    output of the graph, read by the loss here: a layer cannot hand them out chunk by chunk, so the
    layers run unstreamed with that cause named (op and source line) and the remedy; the head
    streams; the probabilities and every gradient are eager's."""
    model, make_inputs = zoo.qwen3("eager")
    inputs = make_inputs("left_pad")
    inputs.kwargs["output_attentions"] = True

    def loss_of(out):
        assert len(out.attentions) == zoo.LAYERS
        return inputs.loss_of(out) + sum((a ** 2).sum() for a in out.attentions)

    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5}, loss_of=loss_of)
    assert_grads_match(run.ref_grads, run.grads)
    for mine, ref in zip(run.out.attentions, run.ref_out.attentions):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)
    assert run.counters["region_fallbacks"] == 0 and run.counters["region_backward"] == 1, run.counters
    said = [w for w in run.warnings if "layer.0" in w]
    assert len(said) == 1 and "[.., T, T] value leaves the layer" in said[0] and "output_attentions=False" in said[0], \
        run.warnings
    assert "eager_attention_forward" in said[0] or "modeling_qwen3.py" in said[0], said[0]


@pytest.mark.parametrize("name,codegen,extra", [
    pytest.param("qwen3_sdpa", "eager", {}, marks=[pytest.mark.fast, pytest.mark.heavy]), ("qwen3_sdpa", "inductor", {}),
    pytest.param("qwen3_eager", "eager", {}, marks=pytest.mark.extended), ("gpt2", "eager", {}), ("mistral_sliding", "eager", {}),
    ("qwen3_sdpa", "eager", {"offload": "disk", "keep_every": 2}), ("qwen3_sdpa", "eager", {"attention": "keep"})])
def test_use_cache_true_streams_and_returns_the_cache(name, codegen, extra):
    """use_cache=True makes every layer's keys and values outputs of the graph (a Hugging Face
    model in train mode keeps its config's use_cache=True): the layers stream all the same and
    return them from their K/V buffers, equal to eager's; a loss that reads the cache gets its
    gradient through them, exactly, also with layer inputs offloaded and rebuilt (the offload op
    returns the cache before its handle) and with the attention kept (before the kept tensors). One
    note per graph says what the cache holds and how to drop it; strict=True does not raise."""
    model, make_inputs = getattr(zoo, name)()
    inputs = make_inputs("left_pad")
    inputs.kwargs["use_cache"] = True

    def loss_of(out):
        cache = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        assert len(cache) == zoo.LAYERS and all(k is not None for k, _ in cache)
        return inputs.loss_of(out) + sum(0.01 * (k ** 2).sum() + 0.02 * v.sum() for k, v in cache)

    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "codegen": codegen, **extra}, loss_of=loss_of)
    assert_grads_match(run.ref_grads, run.grads)
    for mine, ref in zip(run.out.past_key_values.layers, run.ref_out.past_key_values.layers):
        torch.testing.assert_close(mine.keys, ref.keys, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(mine.values, ref.values, rtol=1e-5, atol=1e-6)
    assert sorted(p.name for p in run.programs) == ["head"] + [f"layer.{i}" for i in range(zoo.LAYERS)], run.programs
    assert run.counters["chunks_backward"] > run.counters["region_backward"], run.counters
    if "offload" in extra:
        assert run.counters["inputs_offloaded"] and run.counters["inputs_rebuilt"], run.counters
    if extra.get("attention") == "keep":
        assert run.counters["attention_kept"], run.counters
    assert len(run.warnings) == 1 and "KV cache" in run.warnings[0] and "use_cache=False" in run.warnings[0], \
        run.warnings
    torch._dynamo.reset()
    m = copy.deepcopy(model)
    torch.compile(m, backend="streambp", options={"codegen": "eager", "strict": True})(**inputs.kwargs)


@pytest.mark.fast
def test_a_loss_outside_the_graph_says_to_pass_labels():
    """Called without labels, with the loss computed from the returned logits outside the compiled
    code: the layers stream, the head cannot (no loss in the graph), and the one warning says what
    to change. Exact."""
    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs("left_pad")
    labels = inputs.kwargs.pop("labels")

    def loss_of(out):
        logits = out.logits[:, :-1]
        return F.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)

    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5}, loss_of=loss_of)
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert sorted(p.name for p in run.programs) == [f"layer.{i}" for i in range(zoo.LAYERS)], run.programs
    assert len(run.warnings) == 1 and "no loss in the graph" in run.warnings[0] \
        and "pass labels" in run.warnings[0], run.warnings


def _classifier(cls, **config):
    """The zoo's Qwen3 shape as a Hugging Face classifier (no dropout)."""
    from transformers import Qwen3Config

    cfg = Qwen3Config(vocab_size=zoo.VOCAB, hidden_size=zoo.HIDDEN, intermediate_size=64,
                      num_hidden_layers=zoo.LAYERS, num_attention_heads=zoo.HEADS, num_key_value_heads=zoo.KV_HEADS,
                      head_dim=zoo.HEAD_DIM, max_position_embeddings=zoo.MAX_POS, pad_token_id=zoo.PAD_ID,
                      classifier_dropout=0.0, **config)
    return zoo._hf(cls, cfg, "sdpa")


@pytest.mark.fast
@pytest.mark.heavy
def test_a_pooled_head_streams_its_layers_and_has_nothing_else_to_stream():
    """Sequence classification (a reward model): the loss reads one token per row, the last one
    that is not padding, found by an argmax over the sequence of the token ids. After the last
    layer nothing is wider per token than the hidden state and nothing sums over the tokens:
    there is no head to stream, so strict=True compiles, every layer streams, nothing warns, and
    the gradients are eager's."""
    from transformers import Qwen3ForSequenceClassification

    model = _classifier(Qwen3ForSequenceClassification, num_labels=3)
    ids, mask, _ = zoo.tokens(zoo.Case("pooled", 2, 16, pad="right"))
    inputs = zoo.Inputs((), dict(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 2])),
                        zoo.Case("pooled", 2, 16), lambda o: o.loss, lambda o: o.logits, zoo.VOCAB)
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 4, "strict": True})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert sorted(p.name for p in run.programs) == [f"layer.{i}" for i in range(zoo.LAYERS)], run.programs
    assert all(run.schedules[f"layer.{i}"] and set(run.schedules[f"layer.{i}"]) == {4} for i in range(zoo.LAYERS)), \
        run.schedules
    assert not run.warnings, run.warnings


@pytest.mark.fast
@pytest.mark.heavy
def test_a_head_with_nothing_wider_than_the_hidden_state_runs_whole_without_a_word():
    """Question answering: two logits per token, a softmax over the positions of the sequence
    (the start and end of the answer), which no chunk of tokens computes alone: the head cannot
    stream, and nothing in it is wider per token than the hidden state, so running it whole costs
    no memory the layers' outputs do not. strict=True compiles, the layers stream, nothing warns,
    the gradients are eager's; explain() says why the head runs whole."""
    from transformers import Qwen3ForQuestionAnswering

    model = _classifier(Qwen3ForQuestionAnswering)
    ids, _, _ = zoo.tokens(zoo.Case("qa", 2, 16))
    kwargs = dict(input_ids=ids, start_positions=torch.tensor([3, 5]), end_positions=torch.tensor([7, 9]))
    inputs = zoo.Inputs((), kwargs, zoo.Case("qa", 2, 16), lambda o: o.loss, lambda o: o.start_logits, zoo.VOCAB)
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 4, "strict": True})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)   # (the output bias's gradient cancels: fp64-judged)
    assert sorted(p.name for p in run.programs) == [f"layer.{i}" for i in range(zoo.LAYERS)], run.programs
    assert not run.warnings, run.warnings
    report = streamfx.explain(copy.deepcopy(model), **kwargs, options={"codegen": "eager", "chunk_size": 4})
    said = dict(report.not_streamed)
    assert "runs whole, at no cost in memory" in said.get("head", ""), report.not_streamed
    assert "not a sum" in said["head"], said["head"]


@pytest.mark.fast
@pytest.mark.heavy
def test_a_loss_that_reads_selected_tokens_of_wide_logits_names_the_projection():
    """An LM as a judge: the loss reads one logit at the last position of [B, T, V] logits the LM
    head computed for every token. No sum over the tokens streams them: the refusal says that the
    loss reads selected tokens, names the projection that widens them and what to change (the
    logits do not leave the graph: "pass labels" would not help). strict=True raises it; without,
    the layers stream and the gradients are eager's."""

    class Judge(nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = zoo.qwen3_sdpa()[0]

        def forward(self, input_ids, target):
            return ((self.lm(input_ids=input_ids).logits[:, -1, 5] - target) ** 2).mean()

    ids, _, _ = zoo.tokens(zoo.Case("judge", 2, 16))
    inputs = zoo.Inputs((ids, torch.tensor([0.5, -1.0])), {}, zoo.Case("judge", 2, 16), lambda o: o, None, zoo.VOCAB)
    with pytest.raises(streamfx.StreamBPError, match="reads selected tokens") as raised:
        torch.compile(copy.deepcopy(Judge()), backend="streambp",
                      options={"codegen": "eager", "strict": True})(*inputs.args)
    said = str(raised.value)
    assert "hidden[:, -1] before the LM head" in said and "pass labels" not in said, said
    assert "aten.mm" in said and "self.lm_head(" in said and "aten.select" in said, said
    run = run_eager_and_compiled(Judge(), inputs, {"chunk_size": 4})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert sorted(p.name for p in run.programs) == [f"layer.{i}" for i in range(zoo.LAYERS)], run.programs
    assert len(run.warnings) == 1 and "reads selected tokens" in run.warnings[0], run.warnings


# ---- warnings and options ------------------------------------------------------------------------
@pytest.mark.fast
def test_every_compiled_graph_warns_for_itself():
    """A second model compiled in the same process, refused for the same reason, warns again
    (a model of another size: a new graph; a model of the same structure reuses the first one's
    compiled code and compiles nothing)."""
    messages = []
    for vocab in (50, 60):
        torch.manual_seed(0)
        model = ScoreParamModel("temperature", vocab=vocab, layers=1, flip=True)
        ids = torch.randint(0, 50, (1, 8))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")  # Python's own once-per-location filter
            torch.compile(model, backend="streambp", options={"codegen": "eager"})(ids, ids).backward()
        messages.append(_streamfx_warnings(caught))
    assert len(messages[0]) == 1 and "prims.rev" in messages[0][0], messages
    assert [m.split(" (compiled graph")[0] for m in messages[1]] == [messages[0][0].split(" (compiled graph")[0]]


@pytest.mark.fast
@pytest.mark.parametrize("bad", ["", "/etc/hostname/dumps", 3])
def test_dump_dir_is_checked_with_the_options(bad, tmp_path):
    with pytest.raises(streamfx.StreamBPError, match="dump_dir"):
        streamfx.StreamConfig(dump_dir=bad)
    with pytest.raises(streamfx.StreamBPError, match="dump_dir"):
        torch.compile(nn.Linear(2, 2), backend="streambp", options={"dump_dir": bad})(torch.ones(2))
    assert streamfx.StreamConfig(dump_dir=tmp_path / "new" / "dir").dump_dir


# ---- a sequence of training states -----------------------------------------------------------------
FREEZE = {"none": lambda n: True, "layers": lambda n: ".layers." not in n,
          "attention": lambda n: "self_attn" not in n, "embeddings": lambda n: "embed" not in n,
          "all_but_q_v": lambda n: "q_proj" in n or "v_proj" in n}
LOSSES = {"labels": None, "shifted_sum": "shifted_sum"}
state_strategy = st.tuples(st.sampled_from(sorted(FREEZE)), st.sampled_from(["train", "eval", "no_grad"]),
                           st.sampled_from(sorted(LOSSES)), st.integers(9, 19))


class States:
    """A compiled model and its eager twin driven through training states."""

    def __init__(self, codegen):
        self.model, self.make_inputs = zoo.qwen3_sdpa()
        self.ref = copy.deepcopy(self.model)
        self.compiled = torch.compile(self.model, backend="streambp",
                                      options={"codegen": codegen, "chunk_size": 5, "head_chunk_size": 4})

    def step(self, freeze, mode, loss_kind, T, seed):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(1, zoo.VOCAB, (2, T), generator=g)
        mask = torch.ones(2, T, dtype=torch.long)
        mask[1, : seed % 4] = 0
        labels = ids.masked_fill(mask == 0, -100)
        kwargs = dict(input_ids=ids, attention_mask=mask)
        if loss_kind == "labels":
            kwargs["labels"] = labels

        def loss_of(out):
            if loss_kind == "labels":
                return out.loss
            logp = out.logits[:, :-1].float().log_softmax(-1)
            return logp.gather(-1, ids[:, 1:, None]).squeeze(-1).mul(mask[:, 1:]).sum()

        results = []
        for m, run in ((self.ref, self.ref), (self.model, self.compiled)):
            _set_trainable(m, FREEZE[freeze])
            m.zero_grad(set_to_none=True)
            m.train(mode != "eval")
            if mode == "no_grad":
                with torch.no_grad():
                    results.append((loss_of(run(**kwargs)), None))
                continue
            loss = loss_of(run(**kwargs))
            loss.backward()
            results.append((loss.detach(), grads_of(m)))
        (ref_loss, ref_grads), (loss, grads) = results
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
        if ref_grads is not None:
            assert_grads_match(ref_grads, grads)


@compiling(3)
@given(st.lists(state_strategy, min_size=3, max_size=5))
def test_any_sequence_of_training_states(sequence):
    """Freeze/unfreeze parameter subsets, train/eval, no_grad calls, different losses and lengths,
    in any order, on one compiled model: every call equals eager."""
    torch._dynamo.reset()
    states = States("eager")
    for i, (freeze, mode, loss_kind, T) in enumerate(sequence):
        states.step(freeze, mode, loss_kind, T, seed=i)


@pytest.mark.slow
@pytest.mark.parametrize("sequence", [
    pytest.param([("layers", "train", "labels", 12), ("none", "train", "labels", 12),
                  ("all_but_q_v", "train", "shifted_sum", 15)], marks=pytest.mark.extended),
    [("none", "no_grad", "labels", 10), ("attention", "train", "labels", 17), ("none", "eval", "shifted_sum", 13)],
])
def test_training_states_inductor(sequence):
    states = States("inductor")
    for i, (freeze, mode, loss_kind, T) in enumerate(sequence):
        states.step(freeze, mode, loss_kind, T, seed=i)


# ---- a compiled graph reused after its inputs' requires_grad changed -------------------------------
@pytest.mark.fast
@pytest.mark.parametrize("dynamic", [False, pytest.param(True, marks=pytest.mark.heavy)])
def test_a_graph_called_again_after_unfreezing_compiles_for_the_new_gradients(dynamic):
    """torch < 2.13's Dynamo calls a graph compiled with some parameters frozen again after they
    are unfrozen (pytorch/pytorch#139476): its compiled code returns no gradient for them. Such a
    call (made here by calling the backend's compiled graph directly, on any torch) compiles the
    captured graph again for the gradients it needs, once: exact, silent, and it streams (strict:
    nothing is refused); a capture with symbolic sizes compiles symbolic again, one compile for
    every length."""
    backend = importlib.import_module("streamfx.backend")
    from streamfx.backend import streambp_backend

    torch.manual_seed(0)
    model = zoo.TinyLlama().float().train()
    make = zoo._plain_inputs(zoo.VOCAB)
    ref = copy.deepcopy(model)
    _set_trainable(model, lambda n: "layers." not in n)
    made, now = [], {}

    def recording(gm, example_inputs):
        fn = streambp_backend(gm, example_inputs, {"codegen": "eager", "chunk_size": 5, "strict": True})

        def run(*args):
            made.append((fn, args, now["T"]))
            return fn(*args)

        return run

    compiled = torch.compile(model, backend=recording, dynamic=dynamic)
    lengths = (13, 17) if dynamic else (13,)
    inputs = {T: make(zoo.Case("t", 2, T)) for T in lengths}
    for T in lengths:   # (dynamic: one symbolic graph runs both lengths)
        now["T"] = T
        inputs[T].loss_of(compiled(*inputs[T].args, **inputs[T].kwargs)).backward()
    fn = made[-1][0]
    calls = {T: args for f, args, T in made if f is fn}
    assert set(calls) == set(lengths)
    _set_trainable(model, lambda n: True)
    said, compiles = [], []
    compile_graph = backend._compile_graph

    def counting(gm, example_inputs, *a, **k):
        compiles.append([getattr(x, "shape", x) for x in example_inputs])
        return compile_graph(gm, example_inputs, *a, **k)

    backend._compile_graph = counting
    try:
        for T in lengths * 2:   # (each length twice: the second call reuses its compile, silently)
            for m in (model, ref):
                m.zero_grad(set_to_none=True)
            before = COUNTERS["region_backward"]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                outs = fn(*calls[T])
                next(o for o in outs if isinstance(o, torch.Tensor) and o.dim() == 0 and o.requires_grad).backward()
            said += _streamfx_warnings(caught)
            assert COUNTERS["region_backward"] - before == zoo.LAYERS + 1, "the call did not stream"
            inputs[T].loss_of(ref(*inputs[T].args, **inputs[T].kwargs)).backward()
            assert_grads_match(grads_of(ref), grads_of(model))
            assert grads_of(model)["layers.0.attn.q_proj.weight"].abs().max() > 0
    finally:
        backend._compile_graph = compile_graph
    assert not said, said
    assert len(compiles) == 1, compiles
    sizes = [d for shape in compiles[0] if isinstance(shape, torch.Size) for d in shape]
    assert any(isinstance(d, torch.SymInt) for d in sizes) == dynamic, compiles
