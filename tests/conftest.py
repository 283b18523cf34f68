"""Shared fixtures and helpers of the end-to-end tests: a clean Dynamo per test, eager-vs-compiled
runs with the same weights, and the gradient comparison used everywhere."""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import os
import warnings

import pytest
import torch

# every pipeline step checks its graphs and invariants; rule errors fail instead of refusing
os.environ.setdefault("STREAMFX_VERIFY", "1")


def pytest_configure(config):
    """Under pytest-xdist (``-n N``) the cores are shared: each worker gets its share of torch's
    intra-op threads instead of every worker taking them all."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))


def pytest_runtest_logreport(report):
    """``STREAMFX_DURATIONS=FILE``: each test's phases and seconds appended to FILE as they end
    (what ``tests/tiers.py`` sizes the default run and the fast tier by; a run stopped early
    still leaves the times of what finished). Under pytest-xdist the worker that ran the test
    writes its line; the controller, which gets the same report relayed (``report.node``), does not."""
    path = os.environ.get("STREAMFX_DURATIONS")
    if path and getattr(report, "node", None) is None:
        with open(path, "a") as f:
            f.write(f"{report.duration:.2f}\t{report.when}\t{report.outcome}\t{report.nodeid}\n")


def pytest_collection_modifyitems(config, items):
    """The architecture sweep and the extended tier (``tiers.cases``) run only when asked for by
    name (``-m sweep``, ``-m extended``): the sweep takes over an hour, the extended cases repeat
    capabilities the default run covers, and ``-m "not slow"`` must not select either."""
    expr = config.option.markexpr or ""
    for mark in ("sweep", "extended"):
        if mark in expr:
            continue
        _deselect(config, items, lambda item: item.get_closest_marker(mark) is not None)
    # the fast tier leaves out heavy and slow tests (``heavy``: a few seconds or more on two shared
    # cores, where a lighter test of the capability stays in the fast tier), whatever their module's or
    # function's marks; the default run keeps them
    if "fast" in expr and "heavy" not in expr and "slow" not in expr:
        _deselect(config, items, lambda item: any(item.get_closest_marker(m) is not None for m in ("heavy", "slow")))


def _deselect(config, items, out):
    kept = [item for item in items if not out(item)]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if out(item)])
        items[:] = kept


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Every test compiles from scratch: no cached graphs or guards from an earlier test."""
    torch._dynamo.reset()
    yield


@pytest.fixture(autouse=True)
def _no_run_time_fallback(request):
    """A streamed region that runs whole at run time (its chunk schedule failed) is a bug found
    late: a test in which one does fails, unless it is marked ``expect_fallback``. (With
    ``STREAMFX_VERIFY=1`` such a failure raises at once; this count watches the tests that turn
    verification off to test the user's contract.)"""
    from streamfx.chunks import COUNTERS

    before, vjp_before = COUNTERS["region_fallbacks"], COUNTERS["vjp_fallbacks"]
    yield
    ran = COUNTERS["region_fallbacks"] - before
    if ran and request.node.get_closest_marker("expect_fallback") is None:
        pytest.fail(f"{ran} streamed region call(s) failed at run time and ran whole (see the streamfx "
                    "warnings); mark the test expect_fallback if that is what it tests", pytrace=False)
    vjp = COUNTERS["vjp_fallbacks"] - vjp_before
    if vjp and request.node.get_closest_marker("expect_fallback") is None:
        pytest.fail(f"{vjp} chunk graph(s) had no one-graph backward (the joint trace or Inductor did not take "
                    "them; the training compile ran: exact, slower; see the streamfx logger's debug messages); "
                    "mark the test expect_fallback if that is what it tests", pytrace=False)


def relative_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max|got - ref| / max|ref| (computed in fp64; 0 when both are all zero)."""
    got, ref = got.detach().double(), ref.detach().double()
    scale = ref.abs().max().item()
    diff = (got - ref).abs().max().item()
    if scale == 0.0:
        return diff
    return diff / scale


class Grads(dict):
    """Gradients by parameter name, of an eager reference run; ``fp64``: None, or a function giving
    (loss, gradients) of the same step in float64 (``run_eager_and_compiled``)."""
    fp64 = None


def _within_eager_rounding(name: str, got: torch.Tensor, ref: torch.Tensor, fp64: dict, rtol: float) -> bool:
    """Whether ``got`` is as close to the float64 step's gradient as fp32 allows: within rtol of
    its scale plus twice the eager fp32 gradient's own distance from it. Where the gradient is a
    sum that cancels (exactly zero: a query whose only key is itself; or nearly), the fp32
    reference is rounding noise that another summation order, or another CPU's kernels, does not
    reproduce; a relative error against it says nothing. Where the float64 gradient is zero (at
    most 1e-12 of the step's largest gradient), both fp32 gradients are rounding noise, whose size
    varies with the summation order more than twofold: ``got`` passes when it is within rtol of
    the step's largest gradient (a wrong gradient has the size of the signal, not of the noise)."""
    exact = fp64[1].get(name)
    if exact is None:
        return False
    exact = exact.double()
    err = (got.double() - exact).abs().max().item()
    scale = max((g.double().abs().max().item() for g in fp64[1].values() if g is not None), default=0.0)
    if exact.abs().max().item() <= 1e-12 * scale:
        return err <= rtol * scale
    own = (ref.double() - exact).abs().max().item()
    return err <= rtol * exact.abs().max().item() + 2 * own


def assert_grads_match(model_eager_grads: dict, model_compiled_grads: dict, rtol: float = 1e-4) -> dict:
    """Per parameter, max|g - g_ref| / max|g_ref| <= rtol (fp32 parity is typically ~1e-6); where
    that fails and the reference carries its float64 step (``Grads.fp64``, whose loss matches the
    fp32 one), ``_within_eager_rounding`` decides.

    Both arguments map parameter names to gradients (None where a parameter got no gradient).
    Returns the per-parameter errors."""
    assert model_eager_grads.keys() == model_compiled_grads.keys(), (
        sorted(set(model_eager_grads) ^ set(model_compiled_grads)))
    errors, bad, step64 = {}, [], []

    def fp64():   # (the float64 step, run once when first needed)
        if not step64:
            run = getattr(model_eager_grads, "fp64", None)
            step64.append(run() if run is not None else (None, {}))
        return step64[0]

    for name, ref in model_eager_grads.items():
        got = model_compiled_grads[name]
        if ref is None or got is None:
            assert ref is None and got is None, f"{name}: eager grad {ref is not None}, compiled grad {got is not None}"
            continue
        assert got.shape == ref.shape and got.dtype == ref.dtype, (name, got.shape, ref.shape, got.dtype, ref.dtype)
        assert torch.isfinite(ref).all(), f"{name}: eager reference gradient is not finite"
        assert torch.isfinite(got).all(), f"{name}: compiled gradient is not finite"
        errors[name] = relative_error(got, ref)
        if not errors[name] <= rtol and not _within_eager_rounding(name, got, ref, fp64(), rtol):
            bad.append(f"{name}: {errors[name]:.3e}")
    assert not bad, f"gradients differ (rtol={rtol}): " + ", ".join(bad)
    return errors


def counting_allreduce(names: dict, reduced: list):
    """A DDP comm hook that averages each bucket over the ranks, as DDP's default does, and
    appends the names of the bucket's parameters to ``reduced``. The reduction is synchronous, so
    gloo's worker threads hold no Python callback of it (releasing one needs the GIL; see
    ``test_distributed.finish`` for the teardown deadlock that can cause)."""
    import torch.distributed as dist

    def hook(state, bucket):
        reduced.extend(names[p] for p in bucket.parameters())
        grad = bucket.buffer().div_(dist.get_world_size())
        dist.all_reduce(grad)
        done = torch.futures.Future()
        done.set_result(grad)
        return done

    return hook


def grads_of(model: torch.nn.Module) -> dict:
    return {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in model.named_parameters()}


@dataclasses.dataclass
class Run:
    """An eager-reference run and a compiled run of the same weights on the same inputs."""
    ref_out: object
    out: object
    ref_loss: torch.Tensor
    loss: torch.Tensor
    ref_grads: dict
    grads: dict
    ref_model: torch.nn.Module
    model: torch.nn.Module
    counters: dict          # COUNTERS increments during the compiled forward + backward
    warnings: list          # streamfx warning messages raised during the compiled run
    programs: list          # RegionPrograms registered by this compile (runtime._PROGRAMS)
    schedules: dict         # program name -> chunk count of each region call (forward, backward...)

    def programs_named(self, name: str) -> list:
        return [p for p in self.programs if p.name == name]

    @property
    def head_passes(self) -> int:
        """Chunk passes of the head per step: 1 where it computes its gradients in the forward
        (``seeds``), 2 where its backward recomputes the chunks."""
        return 1 if self.programs_named("head")[-1].seeds is not None else 2


def run_eager_and_compiled(model, inputs, options=None, *, ref_model=None, compile_model=True,
                           loss_of=None) -> Run:
    """Run ``model`` eagerly (reference) and through ``torch.compile(backend="streambp")`` on a
    deep copy (same weights), backward the loss of each, return both losses and gradients.

    ``inputs`` is a ``zoo.Inputs``; ``options`` defaults to eager codegen. ``ref_model`` overrides
    the reference (e.g. an fp32 reference of a bf16 model)."""
    from streamfx.runtime import _PROGRAMS, COUNTERS

    options = {"codegen": "eager", **(options or {})}
    loss_of = loss_of or inputs.loss_of
    ref = copy.deepcopy(ref_model if ref_model is not None else model)
    ref.zero_grad(set_to_none=True)
    ref_out = ref(*inputs.args, **inputs.kwargs)
    ref_loss = loss_of(ref_out)
    ref_loss.backward()

    mine = copy.deepcopy(model)
    mine.zero_grad(set_to_none=True)
    compiled = torch.compile(mine, backend="streambp", options=options) if compile_model else mine
    before, keys = dict(COUNTERS), set(_PROGRAMS)
    with warnings.catch_warnings(record=True) as caught, record_schedules() as schedules:
        warnings.simplefilter("always")
        out = compiled(*inputs.args, **inputs.kwargs)
        loss = loss_of(out)
        loss.backward()
    counters = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
    messages = [str(w.message) for w in caught if "streamfx" in str(w.message)]
    ref_grads = Grads(grads_of(ref))
    ref_grads.fp64 = functools.partial(_step_in_fp64, ref_model if ref_model is not None else model, inputs,
                                       loss_of, ref_loss.detach())
    return Run(ref_out, out, ref_loss.detach(), loss.detach(), ref_grads, grads_of(mine), ref, mine,
               counters, messages, [p for k, p in _PROGRAMS.items() if k not in keys], dict(schedules))


def _step_in_fp64(model, inputs, loss_of, loss32) -> tuple:
    """(loss, gradients) of the eager step in float64: a copy of the model and the floating-point
    inputs in float64. Gradients empty where its loss is not the fp32 one to fp32 precision (a
    step that draws random numbers, or routes tokens otherwise) or an op has no float64 kernel:
    it is then no reference."""
    double = lambda t: t.double() if t.is_floating_point() else t   # noqa: E731
    m = copy.deepcopy(model).double()
    m.zero_grad(set_to_none=True)
    for sub in m.modules():   # (Hugging Face's grouped expert products take no float64: its loop does)
        if getattr(getattr(sub, "config", None), "_experts_implementation", None) not in (None, "eager"):
            sub.config._experts_implementation = "eager"
    args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, double, (inputs.args, inputs.kwargs))
    try:
        loss = loss_of(m(*args, **kwargs))
        loss.backward()
    except (RuntimeError, NotImplementedError):   # (an op without float64 kernels: no reference)
        return None, {}
    if not torch.allclose(loss.detach().float(), loss32.float(), rtol=1e-5, atol=1e-6):
        return loss.detach(), {}
    return loss.detach(), grads_of(m)


@contextlib.contextmanager
def record_schedules():
    """Record, per region program name, how many chunks each forward/backward call ran
    (``RegionProgram.bounds`` is asked once per region call for its chunk schedule)."""
    from streamfx.runtime import RegionProgram

    schedules: dict = collections.defaultdict(list)
    original = RegionProgram.bounds

    def bounds(self, inputs):
        result = original(self, inputs)
        schedules[self.name].append(len(result))
        return result

    RegionProgram.bounds = bounds
    try:
        yield schedules
    finally:
        RegionProgram.bounds = original


def assert_streamed(run: Run, T: int | None = None, head_chunk_size: int | None = None, *,
                    exact_schedule: bool = True) -> None:
    """The head region really ran chunk by chunk, forward and backward: a "head" region program
    was registered by this compile (with the requested chunk size), it ran exactly once forward
    and once backward with ceil(T / head_chunk_size) chunks each (a head that computes its
    gradients in the forward, ``seeds``, runs its chunks and each chunk's backward in the forward
    only: its backward scales the gradients), and the global chunk counters moved by at least
    that much (streamed layer regions add their own chunks). ``exact_schedule=False`` accepts
    extra forward runs of the head (recomputation)."""
    c = run.counters
    heads = run.programs_named("head")
    assert heads, f"no head region program was registered; counters {c}; warnings {run.warnings}"
    assert c["region_forward"] >= 1 and c["region_backward"] >= 1, (c, run.warnings)
    n = 1
    if head_chunk_size is not None:
        # (one program per partition attempt: dropping the logits output re-traces once)
        assert all(p.chunk_size == head_chunk_size for p in heads), [p.chunk_size for p in heads]
        if T is not None:
            from streamfx.passes.schedule import chunk_count

            n = chunk_count(T, head_chunk_size)
    assert c["chunks_forward"] >= n and c["chunks_backward"] >= n, (c, n, run.warnings)
    if T is not None and head_chunk_size is not None:
        runs = run.schedules.get("head", [])
        calls = run.head_passes
        if exact_schedule:
            assert runs == [n] * calls, (run.schedules, n)
        else:
            assert len(runs) >= calls and set(runs) == {n}, (run.schedules, n)


def assert_head_not_streamed(run: Run) -> None:
    """The LM head + loss did not stream in this compile: no head region program ("head", nor
    "head.1", ... of losses over other runs of rows) was registered (layer regions may still
    stream; their chunks are not checked here)."""
    heads = [p for p in run.programs if p.name == "head" or p.name.startswith("head.")]
    assert not heads, [p.name for p in run.programs]


def head_plans(report) -> list:
    """The streamed head plans of a ``streamfx.explain`` report (layer plans left out): ``head``,
    and ``head.1``, ... where losses over different runs of rows are heads of their own."""
    return [p for p in report.plan if p.kind == "head"]


def at_chunk_size(graph, q: int, k: int | None = None):
    """A chunk graph's values at a concrete chunk length ``q`` (and key length ``k``): its nodes'
    "val" metadata, propagated from fake inputs whose symbolic chunk dims have those sizes as
    hints (so sizes compare as those numbers)."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from streamfx import chunks

    mode, fakes = chunks.fake_inputs(graph.slots, graph.sizes, hints={"q": q, "k": k or q})
    FakeTensorProp(graph.gm, mode).propagate_dont_convert_inputs(*fakes)
    return graph.gm
