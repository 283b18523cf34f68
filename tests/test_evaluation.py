"""Evaluation: a call under ``torch.no_grad()`` that computes a loss from trained weights (Hugging
Face's Trainer.evaluate, a validation loop) streams as the training step's forward does: its loss
equals eager's, the logits never exist for the whole sequence, nothing is kept for a backward,
and the outputs need no gradient, as under no_grad."""
import copy
import importlib
import warnings

import pytest
import torch

import streamfx
import zoo
from conftest import relative_error
from streamfx.bench.worker import allocated_peak
from streamfx.runtime import COUNTERS
from tiers import cases

OPTIONS = {"codegen": "eager", "chunk_size": 5, "head_chunk_size": 4}


def _counting(options):
    """A streambp backend that counts the graphs it compiles."""
    backend = streamfx.backend(**options)
    count = [0]

    def counted(gm, example_inputs):
        count[0] += 1
        return backend(gm, example_inputs)

    return counted, count


def _evaluate(run, inputs):
    with torch.no_grad():
        return run(*inputs.args, **inputs.kwargs)


@pytest.mark.parametrize("name,case", cases(
    [(m, c) for m in ("qwen3_sdpa", "qwen3_eager", "llama_tied", "mistral_sliding", "gemma3", "gpt2", "nanogpt",
                      "tiny_llama") for c in ("left_pad", "prompt", "odd13")],
    [("qwen3_sdpa", "left_pad"), ("gemma3", "prompt"), ("gpt2", "odd13"), ("nanogpt", "prompt"),
     ("tiny_llama", "odd13")]))
def test_evaluation_streams_and_equals_eager(name, case):
    """The loss of a no_grad call in eval mode equals eager's; its layers and head run chunk by
    chunk (no backward), the logits beside the loss are returned as None (as in training), and the
    loss needs no gradient."""
    torch._dynamo.reset()
    model, make_inputs = zoo.ZOO[name]()
    model.eval()
    inputs = make_inputs(case)
    ref = inputs.loss_of(_evaluate(model, inputs))
    compiled = torch.compile(copy.deepcopy(model), backend="streambp", options=OPTIONS)
    before = dict(COUNTERS)
    out = _evaluate(compiled, inputs)
    loss = inputs.loss_of(out)
    assert relative_error(loss, ref) <= 1e-6, (loss.item(), ref.item())
    assert not loss.requires_grad and loss.grad_fn is None
    assert inputs.logits_of(out) is None
    ran = {k: COUNTERS[k] - before[k] for k in ("region_forward", "chunks_forward", "region_backward")}
    assert ran["region_forward"] >= 2 and ran["chunks_forward"] > ran["region_forward"], ran
    assert ran["region_backward"] == 0, ran


@pytest.mark.fast
def test_evaluation_never_holds_the_whole_logits_nor_a_backward():
    """At 4096 tokens and an 8,000-word vocabulary one [1, T, V] fp32 logits tensor is 125 MiB;
    eager evaluation holds it and more (the loss's fp32 log-softmax beside it). The streamed
    evaluation (head chunks of 256 tokens) peaks below one such tensor; its loss equals eager's.
    (A no_grad graph compiled as an inference graph holds the logits; the training graph's forward
    run as it is would keep every layer's input for a backward.)"""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch._dynamo.reset()
    V, T = 8000, 4096
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=T, use_cache=False)
    model = Qwen3ForCausalLM(cfg).eval()
    ids = torch.randint(0, V, (1, T))
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "head_chunk_size": 256})
    with torch.no_grad():
        ref = model(input_ids=ids, labels=ids).loss
        compiled(input_ids=ids, labels=ids)   # (compiles)
        eager_peak = allocated_peak(lambda: model(input_ids=ids, labels=ids))
        box = []
        peak = allocated_peak(lambda: box.append(compiled(input_ids=ids, labels=ids).loss))
    logits_bytes = T * V * 4
    assert eager_peak > logits_bytes, eager_peak
    assert peak < logits_bytes, (peak / 2**20, logits_bytes / 2**20)
    assert relative_error(box[0], ref) <= 1e-6


def test_evaluation_loss_cannot_be_differentiated():
    """As under eager no_grad, the loss of an evaluation call has no autograd graph: calling
    backward on it raises, and no gradient is written."""
    torch._dynamo.reset()
    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs("left_pad")
    compiled = torch.compile(model, backend="streambp", options=OPTIONS)
    loss = inputs.loss_of(_evaluate(compiled, inputs))
    with pytest.raises(RuntimeError, match="does not require grad"):
        loss.backward()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.heavy
def test_training_and_evaluation_alternate_exactly_with_one_compile_each():
    """Training steps and evaluations in turn on one compiled model (a trainer evaluating every
    step), then both at a new length: every gradient and loss equals eager's; one graph per grad
    mode and one more per mode at the new length, never one per call. The first evaluation graph
    says once that its logits are not returned, naming ``return_logits``; the second says nothing."""
    importlib.import_module("streamfx.backend")._SAID["evaluation_logits"] = False
    torch._dynamo.reset()
    model, make_inputs = zoo.qwen3_sdpa()
    ref_model = copy.deepcopy(model)
    backend, count = _counting(OPTIONS)
    compiled = torch.compile(model, backend=backend)
    cases_ = ["left_pad", "left_pad", "right_pad", "right_pad", zoo.Case("longer", 2, 21, pad="left")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _alternate(model, ref_model, compiled, make_inputs, cases_)
    said = [str(w.message) for w in caught if "return_logits" in str(w.message)]
    assert len(said) == 1 and "no_grad" in said[0], said
    assert count[0] == 4, count


def _alternate(model, ref_model, compiled, make_inputs, cases_):
    for i, case in enumerate(cases_):
        inputs = make_inputs(case)
        for m in (model, ref_model):
            m.train()
            m.zero_grad(set_to_none=True)
        loss = inputs.loss_of(compiled(*inputs.args, **inputs.kwargs))
        loss.backward()
        ref_loss = inputs.loss_of(ref_model(*inputs.args, **inputs.kwargs))
        ref_loss.backward()
        assert relative_error(loss, ref_loss) <= 1e-6
        for (n, p), r in zip(model.named_parameters(), ref_model.parameters()):
            assert relative_error(p.grad, r.grad) <= 1e-4, n
        model.eval(), ref_model.eval()
        got, want = inputs.loss_of(_evaluate(compiled, inputs)), inputs.loss_of(_evaluate(ref_model, inputs))
        assert relative_error(got, want) <= 1e-6, (i, got.item(), want.item())


def test_evaluation_with_return_logits_returns_them():
    """With ``return_logits=True`` the logits are returned (whole, as eager's) beside the loss."""
    torch._dynamo.reset()
    model, make_inputs = zoo.qwen3_sdpa()
    model.eval()
    inputs = make_inputs("prompt")
    ref = _evaluate(model, inputs)
    compiled = torch.compile(copy.deepcopy(model), backend="streambp", options={**OPTIONS, "return_logits": True})
    out = _evaluate(compiled, inputs)
    assert relative_error(out.loss, ref.loss) <= 1e-6
    assert relative_error(out.logits, ref.logits) <= 1e-6


@pytest.mark.parametrize("form", ["inference_mode", "frozen"])
def test_inference_mode_and_frozen_models_run_as_captured(form):
    """Under ``torch.inference_mode()``, or with no weight that requires a gradient (a frozen
    reference model), a call compiles as the inference graph it is: loss and logits equal eager's."""
    torch._dynamo.reset()
    model, make_inputs = zoo.qwen3_sdpa()
    model.eval()
    if form == "frozen":
        model.requires_grad_(False)
    inputs = make_inputs("left_pad")
    mode = torch.inference_mode if form == "inference_mode" else torch.no_grad
    with mode():
        ref = model(*inputs.args, **inputs.kwargs)
        out = torch.compile(copy.deepcopy(model), backend="streambp", options=OPTIONS)(*inputs.args, **inputs.kwargs)
    assert relative_error(out.loss, ref.loss) <= 1e-6
    assert relative_error(out.logits, ref.logits) <= 1e-6


@pytest.mark.slow
def test_evaluation_streams_under_inductor():
    torch._dynamo.reset()
    model, make_inputs = zoo.qwen3_sdpa()
    model.eval()
    inputs = make_inputs("left_pad")
    ref = inputs.loss_of(_evaluate(model, inputs))
    compiled = torch.compile(copy.deepcopy(model), backend="streambp",
                             options={"chunk_size": 5, "head_chunk_size": 4})
    before = COUNTERS["chunks_forward"]
    out = _evaluate(compiled, inputs)
    assert relative_error(inputs.loss_of(out), ref) <= 1e-5
    assert inputs.logits_of(out) is None and COUNTERS["chunks_forward"] > before



@torch.library.custom_op("streamfx_test::no_derivative", mutates_args=())
def _no_derivative(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_no_derivative.register_fake
def _(x):
    return torch.empty_like(x)


def test_an_evaluation_that_cannot_be_traced_with_its_backward_runs_as_captured(monkeypatch):
    """An op with no derivative is fine under no_grad; the evaluation graph cannot be traced with
    its backward, so it compiles for inference as captured: one warning names the cause, the loss
    and logits equal eager's. (The user's contract: verification off.)"""
    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    torch._dynamo.reset()
    model, make_inputs = zoo.tiny_llama()
    model.eval()
    model.norm.register_forward_hook(lambda m, args, out: _no_derivative(out))
    inputs = make_inputs("odd13")
    ref = _evaluate(model, inputs)
    compiled = torch.compile(copy.deepcopy(model), backend="streambp", options=OPTIONS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _evaluate(compiled, inputs)
    said = [str(w.message) for w in caught if str(w.message).startswith("streamfx")]
    assert len(said) == 1 and "region 'evaluation'" in said[0] and "no_derivative" in said[0], said
    assert relative_error(inputs.loss_of(out), inputs.loss_of(ref)) <= 1e-6
    assert relative_error(inputs.logits_of(out), inputs.logits_of(ref)) <= 1e-6
