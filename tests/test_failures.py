"""Run-time failures of a streamed region's chunk schedule are never silent (``streamfx.failures``):
a device error reaches the caller as itself, naming the region and the chunk; ``strict=True``
raises ``StreamBPError`` naming the region, the chunk, the op and its source line; without strict
the region runs whole for that call, warned once and counted (``COUNTERS``, ``explain()``)."""
from __future__ import annotations

import warnings

import pytest
import torch

import zoo
from conftest import assert_grads_match, run_eager_and_compiled


def _failing_chunk(monkeypatch, err: Exception, train: bool, at: int | None = 2, region: str = "layer"):
    """The chunk graphs of the regions whose names start with ``region`` run as usual except the
    ``at``-th run-time call (None: every call) of an inference (``train=False``: the forward) or
    training compile (the backward), which raises ``err``. (The whole region's graph, which a
    region falls back to, is left alone.)"""
    from torch._subclasses import FakeTensor

    from streamfx.runtime import LayerProgram, RegionProgram

    calls, backward = [], train

    def failing(original):
        def fn(self, graph=None, train=True):
            run = original(self, graph, train)
            if train != backward or not self.name.startswith(region):
                return run

            def chunk(*args):
                if any(isinstance(x, FakeTensor) for x in args):  # (a compile-time evaluation)
                    return run(*args)
                calls.append(self.name)
                if at is None or len(calls) == at:
                    raise err
                return run(*args)

            return chunk

        return fn

    for cls in (RegionProgram, LayerProgram):
        monkeypatch.setattr(cls, "fn", failing(cls.__dict__["fn"]))
    return calls


@pytest.mark.fast
@pytest.mark.parametrize("part", ["forward", "backward"])
def test_out_of_memory_in_a_chunk_reaches_the_caller(monkeypatch, part):
    """An out-of-memory error raised by a chunk mid-schedule is the error the caller catches: the
    same object, its type, a note naming the region and the chunk; the region is not rerun whole."""
    from streamfx.runtime import COUNTERS

    err = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    calls = _failing_chunk(monkeypatch, err, train=part == "backward")
    model, make_inputs = zoo.tiny_llama()
    inputs = make_inputs("odd13")
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "chunk_size": 5})
    before = dict(COUNTERS)
    with pytest.raises(torch.OutOfMemoryError) as caught:
        compiled(*inputs.args)[0].backward()
    assert caught.value is err and type(caught.value) is torch.OutOfMemoryError
    notes = "\n".join(getattr(err, "__notes__", []))
    assert "region 'layer." in notes and f"the {part} of chunk [" in notes and "of 13 tokens" in notes, notes
    assert len(calls) == 2
    assert COUNTERS["region_fallbacks"] == before["region_fallbacks"]


@pytest.mark.fast
def test_strict_raises_a_failing_chunk_with_its_op_and_source_line():
    """strict=True: a chunk graph that fails at run time raises StreamBPError naming the region,
    the chunk, the op that raised and the model's source line of that op."""
    import streamfx
    from streamfx.runtime import _PROGRAMS

    model, make_inputs = zoo.tiny_llama()
    inputs = make_inputs("odd13")
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "chunk_size": 5, "strict": True})
    known = set(_PROGRAMS)
    compiled(*inputs.args)[0].backward()
    # (the last one: dropping the logits output traces again, each trace registers its programs)
    layer = [p for k, p in _PROGRAMS.items() if k not in known and p.name == "layer.1"][-1]
    node = next(n for n in layer.chunk.gm.graph.nodes   # (SwiGLU's gate)
                if n.target is torch.ops.aten.silu.default and "zoo.py" in n.meta.get("stack_trace", ""))

    def broken_silu(x):
        if x.shape[1] < 5:  # the last, uneven chunk
            raise IndexError("index 18 is out of bounds for dimension 0 with size 16")
        return torch.ops.aten.silu.default(x)

    node.target = broken_silu
    layer.chunk.gm.recompile()
    with pytest.raises(streamfx.StreamBPError) as caught:
        compiled(*inputs.args)
    text = str(caught.value)
    assert "region 'layer.1' could not run chunk by chunk (IndexError: index 18 is out of bounds" in text, text
    assert "broken_silu at " in text and "zoo.py" in text and "the forward of chunk [10, 13) of 13 tokens" in text, text
    assert text.endswith("(strict=True)"), text


@pytest.mark.fast
@pytest.mark.expect_fallback
def test_without_strict_a_failing_chunk_runs_whole_warned_once_and_counted(monkeypatch):
    """Without strict the region runs whole for the call (exact), one warning for any number of
    calls, every call counted: in ``COUNTERS`` and in ``explain()``'s report."""
    import streamfx
    from streamfx.runtime import COUNTERS

    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    _failing_chunk(monkeypatch, RuntimeError("a chunk that does not run"), train=False, at=None, region="layer.0")
    model, make_inputs = zoo.tiny_llama()
    inputs = make_inputs("odd13")
    before = COUNTERS["region_fallbacks"]
    run = run_eager_and_compiled(model, inputs, {"chunk_size": 5})
    assert_grads_match(run.ref_grads, run.grads)
    said = [w for w in run.warnings if "could not run chunk by chunk (RuntimeError: a chunk that does not run)" in w]
    assert len(said) == 1 and "region 'layer.0'" in said[0] and "of chunk [0, 5) of 13 tokens" in said[0], run.warnings
    # the forward, and the backward (whose keys and values are recomputed by the inference compile)
    assert COUNTERS["region_fallbacks"] == before + 2
    compiled = torch.compile(run.model, backend="streambp", options={"codegen": "eager", "chunk_size": 5})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            compiled(*inputs.args)[0].backward()
    said = [w for w in caught if "could not run chunk by chunk" in str(w.message)]
    # (Dynamo reuses the first compile: the same region programs, already warned)
    assert not said and COUNTERS["region_fallbacks"] == before + 8, [str(w.message) for w in caught]
    # each program keeps the distinct causes, not one entry per call of a long run
    from streamfx.runtime import _PROGRAMS
    kept = [p.fallbacks for p in _PROGRAMS.values() if p.name == "layer.0" and p.fallbacks]
    assert kept and all(len(f) == len(set(f)) <= 2 for f in kept), kept
    report = streamfx.explain(model, *inputs.args, options={"chunk_size": 5}, dynamic=False)
    assert [where for where, _ in report.fallbacks] == ["layer.0"], report.fallbacks
    assert "ran whole at run time (1" in str(report) and "a chunk that does not run" in str(report), str(report)


@pytest.mark.fast
def test_device_errors_are_told_apart():
    from streamfx.failures import is_device_error

    assert is_device_error(torch.OutOfMemoryError("CUDA out of memory"))
    assert is_device_error(RuntimeError("CUDA error: device-side assert triggered"))
    assert not is_device_error(RuntimeError("index 18 is out of bounds"))
    assert not is_device_error(IndexError("CUDA error"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not is_device_error(ValueError("Cannot view a tensor"))


@pytest.mark.parametrize("codegen", ["eager", "inductor"])
def test_anomaly_mode_streams_exactly(codegen):
    """Under ``torch.autograd.set_detect_anomaly(True)`` (a user hunting a NaN) every region still
    streams, exactly, without a warning: the backward traces through fake tensors (the joint graph,
    each chunk graph's vjp, the memory model's curves) run without anomaly mode's NaN check, which
    reads values a fake tensor has not, as AOTAutograd's own trace does."""
    model, make_inputs = zoo.qwen3()
    with torch.autograd.set_detect_anomaly(True):
        run = run_eager_and_compiled(model, make_inputs("right_pad"),
                                     {"codegen": codegen, "chunk_size": 5, "memory_budget": "1GiB"})
    assert not run.warnings, run.warnings
    assert run.counters["region_forward"] == zoo.LAYERS + 1 and run.counters["region_backward"] == zoo.LAYERS + 1
    assert run.counters["region_fallbacks"] == 0, run.counters
    assert_grads_match(run.ref_grads, run.grads)


@pytest.mark.fast
def test_anomaly_modes_nan_reaches_the_caller_as_in_eager():
    """A NaN that anomaly mode finds in a chunk's backward is the model's, not a failure of the
    schedule: its RuntimeError reaches the caller as itself (as eager raises one), with a note
    naming the region, never rerun whole nor turned into a StreamBPError."""
    import streamfx

    model, make_inputs = zoo.qwen3()
    inputs = make_inputs("right_pad")
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    for step in (model, torch.compile(model, backend="streambp", options={"codegen": "eager", "chunk_size": 5})):
        with torch.autograd.set_detect_anomaly(True), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # (anomaly mode's own tracebacks)
            with pytest.raises(RuntimeError, match="returned nan values") as raised:
                inputs.loss_of(step(*inputs.args, **inputs.kwargs)).backward()
        assert not isinstance(raised.value, streamfx.StreamBPError)
    assert any("streamfx: raised in region" in note for note in getattr(raised.value, "__notes__", [])), \
        getattr(raised.value, "__notes__", None)
