"""Gradient parity through the streambp backend against eager autograd, over the model zoo.

Every test compiles a deep copy of a zoo model (same weights), runs forward + backward on the
same inputs as an eager reference, and checks the loss and *every* parameter gradient
(max|g - g_ref| / max|g_ref| <= 1e-4; fp32 parity is ~1e-6 in practice). Every test also checks
that the LM head + loss region really streamed (a "head" region program was registered and the
chunk counters moved), so a pass that silently stops applying fails here; where the head does
*not* stream today, the test asserts that current behaviour explicitly and says why.

Cases are spread over the zoo (not the full cross product) to keep the file at about three
minutes on two CPU cores; every case runs on at least two models, every model on two or more
cases (the head tests in test_head_streaming.py add more cases on nanoGPT, Qwen3, TinyLlama). ``codegen="eager"`` everywhere except the ``inductor`` tests at the end.
"""
import pytest
import torch

import streamfx
import zoo
from conftest import (assert_grads_match, assert_head_not_streamed, assert_streamed,
                      run_eager_and_compiled)

HEAD_CHUNK = 4  # T = 13..17 -> 4 or 5 head chunks, partial last chunk for odd T

EAGER_MATRIX = {
    "qwen3_sdpa": ["right_pad", "left_pad", "odd17"],
    "qwen3_eager": ["left_pad", "prompt"],
    "llama_tied": ["right_pad", "odd17"],
    "mistral_sliding": ["b1", "odd13"],                # sliding_window 5 < T
    "gemma3": ["right_pad", "odd17"],                  # sliding (4) + global layers, logit softcapping
    "nanogpt": ["b1", "right_pad"],
    "tiny_llama": ["left_pad", "prompt", "odd17"],
    "tiny_llama_gqa": ["right_pad", "odd13"],          # grouped K/V heads given to SDPA (enable_gqa)
    "gpt2_loss_type": ["left_pad", "odd13"],
}
# the first case of every model is in the fast tier (-m fast)
PARAMS = [pytest.param(m, c, id=f"{m}-{c}", marks=[pytest.mark.fast] if i == 0 else [])
          for m, cases in EAGER_MATRIX.items() for i, c in enumerate(cases)]


def gpt2_loss_type():
    """GPT-2 with ``model.loss_type = "ForCausalLM"``: without it, transformers' ``loss_function``
    property logs a ``warning_once`` between the LM head and the loss (a graph break, unless Dynamo
    ignores it: see ``test_gpt2_logging_between_head_and_loss_costs_no_streaming``)."""
    model, make_inputs = zoo.gpt2()
    model.loss_type = "ForCausalLM"
    return model, make_inputs


def build(name):
    return gpt2_loss_type() if name == "gpt2_loss_type" else zoo.ZOO[name]()


def check_parity(run, inputs, head_chunk_size=HEAD_CHUNK, rtol=1e-4):
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads, rtol=rtol)
    assert_streamed(run, T=inputs.T, head_chunk_size=head_chunk_size)
    # return_logits=False and a loss is computed: the logits output is dropped
    assert inputs.logits_of(run.out) is None
    assert not [w for w in run.warnings if "region 'head'" in w], run.warnings


@pytest.mark.parametrize("name, case", PARAMS)
def test_parity_eager_codegen(name, case):
    model, make_inputs = build(name)
    inputs = make_inputs(case)
    run = run_eager_and_compiled(model, inputs, {"codegen": "eager", "head_chunk_size": HEAD_CHUNK})
    check_parity(run, inputs)


@pytest.mark.fast
def test_every_case_and_model_covered():
    cases = {c for cs in EAGER_MATRIX.values() for c in cs}
    assert cases == set(zoo.CASES)
    assert set(zoo.ZOO) - {"gpt2", "qwen3_moe"} <= set(EAGER_MATRIX)  # (MoE: tests/test_moe.py)
    for c in zoo.CASES:
        assert sum(c in cs for cs in EAGER_MATRIX.values()) >= 2, c


@pytest.mark.fast
def test_gpt2_logging_between_head_and_loss_costs_no_streaming():
    """Stock GPT2LMHeadModel logs a ``warning_once`` between its LM head and its loss
    (``PreTrainedModel.loss_function``: it sets no loss type). Dynamo ignores logging calls in code
    compiled through streamfx (``streamfx/logging_calls.py``), so one graph holds the LM head and
    the loss: the head streams over the logits too, the logits output is None, nothing warns."""
    from streamfx import logging_calls

    model, make_inputs = zoo.gpt2()
    logging_calls.install()  # (as loading streamfx does in a fresh process: this file's Dynamo reset cleared it)
    inputs = make_inputs("b1")
    run = run_eager_and_compiled(model, inputs, {"head_chunk_size": HEAD_CHUNK})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert_streamed(run, T=inputs.T, head_chunk_size=HEAD_CHUNK)
    assert inputs.logits_of(run.out) is None and not run.warnings, run.warnings


def test_gpt2_logging_ignored_when_streamfx_is_imported_before_transformers():
    """A fresh process that imports streamfx before transformers (``logging.Logger`` has no
    ``warning_once`` yet when the backend loads): the method is ignored once transformers' logging
    module has run, so GPT-2's head streams in one graph with its loss and nothing warns."""
    import subprocess
    import sys

    code = (
        "import streamfx, sys, warnings\n"
        "assert 'transformers' not in sys.modules\n"
        "sys.path.insert(0, 'tests')\n"
        "import torch, zoo\n"
        "from conftest import run_eager_and_compiled, assert_grads_match, assert_streamed\n"
        "model, make_inputs = zoo.gpt2()\n"
        "inputs = make_inputs('b1')\n"
        "run = run_eager_and_compiled(model, inputs, {'head_chunk_size': 5})\n"
        "assert_grads_match(run.ref_grads, run.grads)\n"
        "assert not run.warnings, run.warnings\n"
        "assert_streamed(run, T=inputs.T, head_chunk_size=5)\n"
        "assert inputs.logits_of(run.out) is None\n"
        "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          cwd=str(__import__("pathlib").Path(__file__).parent.parent))
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_gpt2_graph_break_head_streams_in_its_own_graph(monkeypatch):
    """With logging calls traced as Dynamo does by default (a graph break at GPT-2's ``warning_once``
    before its loss), graph 1 ends at the logits and graph 2 computes the loss from them. Graph 2 is
    a head-only graph: its sequence axis comes from the labels, and it streams. Gradients are
    exact. The logits exist whole between the graphs, and one warning says so."""
    from streamfx import logging_calls

    monkeypatch.setattr(logging_calls, "install", lambda: None)
    model, make_inputs = zoo.gpt2()
    inputs = make_inputs("b1")
    with torch._dynamo.config.patch(ignore_logging_functions=set()):
        run = run_eager_and_compiled(model, inputs, {"head_chunk_size": HEAD_CHUNK})
    assert_grads_match(run.ref_grads, run.grads)
    assert [p.name for p in run.programs if p.name == "head"] == ["head"], [p.name for p in run.programs]
    caveats = [m for m in run.warnings if "region 'head' streams, but its logits arrive as an input" in m]
    assert len(caveats) == 1, run.warnings


def assert_exact_and_head_not_streamed(model, inputs):
    """Exact loss and gradients through the backend, the head unstreamed and the logits kept."""
    run = run_eager_and_compiled(model, inputs, {"codegen": "eager", "head_chunk_size": HEAD_CHUNK})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert_head_not_streamed(run)
    assert inputs.logits_of(run.out) is not None


def test_logit_shift_streams():
    """The classic hand-written shift ``F.cross_entropy(logits[:, :-1].reshape(-1, V),
    labels[:, 1:].reshape(-1))`` streams: the slice is moved in front of the LM head, the head
    runs over T - 1 tokens, and the whole-sequence logits output is None (return_logits=False)."""
    model, make_inputs = zoo.tiny_llama_logit_shift()
    inputs = make_inputs("prompt")
    run = run_eager_and_compiled(model, inputs, {"codegen": "eager", "head_chunk_size": HEAD_CHUNK})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert_streamed(run, T=inputs.T - 1, head_chunk_size=HEAD_CHUNK)
    assert inputs.logits_of(run.out) is None


# ---- inductor codegen: a smaller set (each compile is ~15-50 s on two cores) --------------------
@pytest.mark.parametrize("name, case", [
    pytest.param("nanogpt", "prompt", id="nanogpt-prompt"),
    pytest.param("qwen3_sdpa", "right_pad", id="qwen3_sdpa-right_pad"),
])
def test_parity_inductor_codegen(name, case):
    model, make_inputs = build(name)
    inputs = make_inputs(case)
    run = run_eager_and_compiled(model, inputs, {"codegen": "inductor", "head_chunk_size": HEAD_CHUNK})
    check_parity(run, inputs)
    assert all(p.codegen == "inductor" for p in run.programs_named("head"))


@pytest.mark.fast
def test_compile_metrics_are_recorded_with_the_ignored_logging_functions():
    """With transformers' logging methods in Dynamo's ignored functions, each compile is still
    recorded in ``compilation_metrics`` (what ``streamfx.frames`` reads the skipped functions
    from): torch 2.11 sorts that set when it records the config, and two functions do not compare."""
    import transformers  # noqa: F401 - adds warning_once / info_once to logging.Logger

    import streamfx  # noqa: F401
    from streamfx import logging_calls

    logging_calls.ignore_logging_calls()
    assert len(torch._dynamo.config.ignore_logging_functions) >= 2
    assert isinstance(torch._dynamo.utils._get_dynamo_config_for_logging(), str)
    def recorded_by_the_metrics_test(x):
        return x * 2

    torch._dynamo.reset()
    torch.compile(recorded_by_the_metrics_test, backend="eager")(torch.ones(3))
    last = torch._dynamo.utils.get_compilation_metrics()[-1]   # (a bounded deque: its last record)
    assert last.co_name == "recorded_by_the_metrics_test", last



@pytest.mark.fast
def test_a_gradient_of_rounding_noise_is_judged_against_the_float64_step():
    """A query whose only key is itself has no gradient through its attention scores: a length-2
    sequence with one label leaves the query and key projections' gradients exactly zero, which
    eager fp32 computes as rounding noise on some CPUs. A relative error against that noise says
    nothing; the float64 step decides (``conftest._within_eager_rounding``): the exact gradient
    passes against a noisy reference, one further from the float64 step than fp32 allows still
    fails, and without a float64 reference the relative error decides."""
    from conftest import Grads

    model, make_inputs = zoo.qwen3("sdpa")
    run = run_eager_and_compiled(model, make_inputs(zoo._case("b1")), {"chunk_size": 3})
    assert_grads_match(run.ref_grads, run.grads)
    loss64, grads64 = run.ref_grads.fp64()
    assert grads64 and torch.allclose(loss64.float(), run.ref_loss, rtol=1e-6)
    name = "model.layers.0.self_attn.q_proj.weight"
    exact = grads64[name].float()
    scale = exact.abs().max()

    def reference(grad, fp64=run.ref_grads.fp64):
        g = Grads({name: grad})
        g.fp64 = fp64
        return g

    noisy = exact + 1e-3 * scale   # (an fp32 reference 1e-3 of its scale from the float64 step)
    assert_grads_match(reference(noisy), {name: exact})
    with pytest.raises(AssertionError, match="gradients differ"):
        assert_grads_match(reference(noisy), {name: exact + 5e-3 * scale})
    with pytest.raises(AssertionError, match="gradients differ"):
        assert_grads_match(reference(noisy, lambda: (None, {})), {name: exact})

    # an exactly zero gradient (float64 says so): fp32 noise of either size passes, a signal fails
    zero, big = torch.zeros(4, 4, dtype=torch.float64), torch.full((4, 4), 2.0, dtype=torch.float64)

    def zero_step():
        return loss64, {"zero": zero, "big": big}

    def pair(noise):
        g = Grads({"zero": torch.full((4, 4), noise), "big": big.float()})
        g.fp64 = zero_step
        return g

    assert_grads_match(pair(3e-9), {"zero": torch.full((4, 4), 1.2e-8), "big": big.float()})
    with pytest.raises(AssertionError, match="gradients differ"):
        assert_grads_match(pair(3e-9), {"zero": torch.full((4, 4), 1e-3), "big": big.float()})


# ---- the logits output: detached before the rewrite, kept where the rewrite fails ---------------
def _counting(monkeypatch, module, name):
    calls, original = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


@pytest.mark.fast
@pytest.mark.parametrize("guess", [True, False], ids=["guessed", "planned"])
def test_the_dropped_logits_are_detached_before_the_rewrite_runs(guess, monkeypatch):
    """A head that drops the logits: the graph is traced with them detached from the start (the
    backend's guess: the output beside the loss it is computed from), or, without the guess, traced
    again with them detached as soon as the plans say so; the rewrite (chunk graphs built and
    checked) runs once, on the detached trace."""
    import importlib

    from streamfx.passes import pipeline

    backend = importlib.import_module("streamfx.backend")
    if not guess:
        monkeypatch.setattr(backend, "likely_dropped", lambda gm, config: ())
    traces = _counting(monkeypatch, backend, "_compile")
    rewrites = _counting(monkeypatch, pipeline, "stream_joint")
    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs("right_pad")
    run = run_eager_and_compiled(model, inputs, {"codegen": "eager", "head_chunk_size": HEAD_CHUNK})
    assert (len(traces), len(rewrites)) == ((1, 1) if guess else (2, 1))
    assert inputs.logits_of(run.out) is None
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    assert_streamed(run)


class _LogProbs(torch.nn.Module):
    """A causal LM returning its loss beside per-token log-probabilities (a head output the
    streamed step keeps: it is no wider per token than the hidden state), and its logits too
    with ``logits``."""

    def __init__(self, lm, logits: bool):
        super().__init__()
        self.lm, self.logits = lm, logits

    def forward(self, input_ids, labels):
        logits = self.lm(input_ids=input_ids).logits[:, :-1]
        target = labels[:, 1:]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        logp = logp * (target != -100)
        loss = -logp.sum() / (target != -100).sum()
        return (loss, logits, logp) if self.logits else (loss, logp)


@pytest.mark.fast
@pytest.mark.heavy
@pytest.mark.parametrize("logits", [False, True], ids=["logprobs", "logits_and_logprobs"])
def test_a_guess_the_plans_do_not_bear_out_costs_one_trace_and_keeps_the_gradients(logits, monkeypatch):
    """The backend guesses the per-token log-probs beside the loss as dropped; the plans keep them
    (and drop the logits where returned): traced once more before any rewrite ran, as the plans
    say, and the log-probs the loss reads outside the graph keep their gradient."""
    import copy
    import importlib

    from streamfx.passes import pipeline
    from streamfx.runtime import _PROGRAMS

    backend = importlib.import_module("streamfx.backend")
    traces = _counting(monkeypatch, backend, "_compile")
    rewrites = _counting(monkeypatch, pipeline, "stream_joint")
    lm, make_inputs = zoo.qwen3_sdpa()
    model = _LogProbs(lm, logits)
    kwargs = make_inputs("right_pad").kwargs
    kwargs = dict(input_ids=kwargs["input_ids"], labels=kwargs["labels"])

    def loss_of(out):   # the log-probs read outside the compiled graph too
        return out[0] + 0.5 * out[-1].pow(2).mean()

    ref = copy.deepcopy(model)
    ref_loss = loss_of(ref(**kwargs))
    ref_loss.backward()
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "head_chunk_size": HEAD_CHUNK})
    before = set(_PROGRAMS)
    out = compiled(**kwargs)
    assert out[-1].requires_grad
    if logits:
        assert out[1] is None
    loss = loss_of(out)
    loss.backward()
    assert (len(traces), len(rewrites)) == (2, 1)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    grads = {k.replace("_orig_mod.", ""): p.grad for k, p in compiled.named_parameters()}
    assert_grads_match({k: p.grad for k, p in ref.named_parameters()}, grads)
    assert [p.name for k, p in _PROGRAMS.items() if k not in before].count("head") == 1


@pytest.mark.fast
@pytest.mark.heavy
@pytest.mark.parametrize("where", ["rewrite", "compile"])
def test_a_detached_retrace_whose_rewrite_fails_keeps_the_logits_gradient(where, monkeypatch):
    """The retraced graph's rewrite fails (a refusal), or its compile after the rewrite (an
    error): the graph runs as captured, unstreamed and warned, and the logits it returns keep
    their gradient (a loss that reads them is exact)."""
    import copy
    import warnings

    from streamfx import membudget
    from streamfx.errors import CannotStream
    from streamfx.passes import pipeline

    def failing(*args, **kwargs):
        if where == "rewrite":
            raise CannotStream("injected rewrite failure")
        raise RuntimeError("injected rewrite failure")

    monkeypatch.setattr(*((pipeline, "stream_joint") if where == "rewrite" else (membudget, "attach")), failing)
    monkeypatch.setenv("STREAMFX_VERIFY", "0")   # (the user's contract: under verify a compile error is raised)
    model, make_inputs = zoo.qwen3_sdpa()
    inputs = make_inputs("right_pad")
    ref, mine = model, copy.deepcopy(model)
    compiled = torch.compile(mine, backend="streambp", options={"codegen": "eager"})
    torch._dynamo.reset()
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for m in (ref, compiled):
            out = m(*inputs.args, **inputs.kwargs)
            assert out.logits is not None and out.logits.requires_grad
            loss = out.loss + out.logits.float().pow(2).mean()
            loss.backward()
            losses.append(loss.detach())
    assert any("injected rewrite failure" in str(w.message) for w in caught), [str(w.message) for w in caught]
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)
    grads = {k.replace("_orig_mod.", ""): p.grad for k, p in compiled.named_parameters()}
    assert_grads_match({k: p.grad for k, p in ref.named_parameters()}, grads)
    if where == "rewrite":   # explain says why, though the graph then compiled as captured
        report = streamfx.explain(model, *inputs.args, **inputs.kwargs)
        assert any("injected rewrite failure" in why for _, why in report.not_streamed), report.not_streamed
