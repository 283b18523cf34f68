"""A streamed layer's backward runs each chunk's recomputation and backward as one compiled graph
(``chunks.Vjp``): nothing of the forward is recomputed that no gradient reads (a layer's last
projection, whose output only feeds the residual sum), so the streamed step does fewer matrix
products than checkpointing, which reruns the whole layer. Exact against eager; the training
compile (and autograd) runs a graph the joint trace does not take."""
from __future__ import annotations

import pytest
import torch

import zoo
from conftest import assert_grads_match, run_eager_and_compiled
from tiers import cases

from streamfx import chunks


def _matmul_flops(step) -> int:
    """2 * m * k * n summed over the matrix products ``step()`` runs (as the profiler records them:
    eager ops and Inductor's calls of the same kernels alike)."""
    from torch.profiler import profile

    with profile(record_shapes=True) as prof:
        step()
    total = 0
    for e in prof.events():
        shapes = e.input_shapes
        if e.name == "aten::mm":
            a, b = shapes[0], shapes[1]
        elif e.name == "aten::addmm":
            a, b = shapes[1], shapes[2]
        elif e.name == "aten::bmm":
            total += 2 * shapes[0][0] * shapes[0][1] * shapes[0][2] * shapes[1][2]
            continue
        else:
            continue
        total += 2 * a[0] * a[1] * b[1]
    return total


def _checkpointed_flops(make) -> int:
    model, inputs = make()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    batch = inputs("prompt")

    def step():
        batch.loss_of(model(*batch.args, **batch.kwargs)).backward()

    step()   # (warm-up)
    return _matmul_flops(step)


@pytest.mark.parametrize("make", cases([zoo.qwen3_sdpa, zoo.llama_tied], default=[zoo.qwen3_sdpa]),
                         ids=["qwen3", "llama_tied"])
def test_the_streamed_step_runs_fewer_matmuls_than_checkpointing_and_is_exact(make, monkeypatch):
    model, inputs = make()
    batch = inputs("prompt")
    options = {"codegen": "inductor", "chunk_size": 5}
    chunks.forget()   # (compiled afresh: the counters below count this model's compiles)
    run = run_eager_and_compiled(model, batch, options)
    assert_grads_match(run.ref_grads, run.grads)
    assert run.counters["vjp_compiles"] > 0 and run.counters["vjp_fallbacks"] == 0, run.counters

    compiled = torch.compile(run.model, backend="streambp", options=options)

    def step():
        batch.loss_of(compiled(*batch.args, **batch.kwargs)).backward()

    step()
    streamed = _matmul_flops(step)
    ckpt = _checkpointed_flops(make)
    # the last projection of a layer (its MLP's down projection: intermediate x hidden per token)
    # is not run again in the backward, where checkpointing reruns it
    tokens = batch.case.B * batch.case.T
    cfg = run.model.config
    down = 2 * tokens * cfg.intermediate_size * cfg.hidden_size * cfg.num_hidden_layers
    assert streamed < ckpt, (streamed, ckpt)

    # control: the training compile and autograd (what ran before) recompute it, and give the
    # same gradients
    monkeypatch.setattr(chunks.ChunkGraph, "vjp", lambda self, codegen, grads, mode="default": None)
    run.model.zero_grad(set_to_none=True)
    step()
    grads = {n: p.grad.clone() for n, p in run.model.named_parameters() if p.grad is not None}
    run.model.zero_grad(set_to_none=True)
    trained = _matmul_flops(step)
    # (every layer's but the last's: the last's region ends with the model's final norm, whose
    # backward reads the sum the projection's output goes into)
    assert trained - streamed >= down * (cfg.num_hidden_layers - 1) // cfg.num_hidden_layers, \
        (trained, streamed, down)
    assert_grads_match(run.ref_grads, {n: grads.get(n) for n in run.ref_grads})


@pytest.mark.fast
@pytest.mark.heavy
@pytest.mark.expect_fallback
def test_a_graph_the_joint_trace_does_not_take_runs_its_training_compile(monkeypatch):
    """A failing joint compile is no failure of the step: the chunk's training compile runs."""
    def refuse(*args, **kwargs):
        raise RuntimeError("no joint compile of this graph")

    monkeypatch.setattr(chunks, "_compile_vjp", refuse)
    chunks.forget()
    model, inputs = zoo.tiny_llama()
    run = run_eager_and_compiled(model, inputs("prompt"), {"codegen": "inductor", "chunk_size": 5})
    assert_grads_match(run.ref_grads, run.grads)
    assert run.counters["vjp_fallbacks"] > 0 and run.counters["region_fallbacks"] == 0, run.counters
    assert not run.warnings, run.warnings
    chunks.forget()


def test_the_joint_trace_takes_ops_whose_shape_rule_needs_the_python_dispatcher():
    """Bloom's ALiBi: ``baddbmm`` of the per-key bias [B*H, 1, T] broadcasts it to the chunk's
    rows; its shape rule expands at the symbolic chunk sizes, which only the Python dispatcher's
    rules take (the joint trace runs under it, as AOTAutograd's does). Every chunk's backward runs
    the one-graph vjp (the autouse check fails a test with a fallback), exact."""
    chunks.forget()
    model, inputs = zoo.alibi()
    run = run_eager_and_compiled(model, inputs("prompt"), {"codegen": "inductor", "chunk_size": 5})
    assert_grads_match(run.ref_grads, run.grads)
    assert run.counters["vjp_compiles"] > 0 and run.counters["vjp_fallbacks"] == 0, run.counters
    chunks.forget()
