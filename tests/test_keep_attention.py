"""``attention="keep"``: a streamed layer keeps each fused attention's output and log-sum-exp from
the forward, and its backward runs the kernel's backward from them: the attention's forward runs
once per step instead of twice, and the gradients are those of ``attention="recompute"`` (exact
against eager), with or without a data mask. Layers whose attention cannot read a kept output
(no fused attention, a kernel without such a backward) keep nothing and say so; a call that runs
a query graph variant that cannot recomputes, warned once."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import zoo
from conftest import assert_grads_match, grads_of, run_eager_and_compiled
from tiers import cases
from test_failures import _failing_chunk
from test_kernels import CASES, CHUNK, T, kernel_context, rel

from streamfx import StreamBPError, blocks, emulate
from streamfx.passes.schedule import chunk_count


def _count_attention_forwards(monkeypatch) -> list:
    """Every attention forward a streamed layer runs: ``streamfx::causal_blocks`` (a chunk's
    attention on a top-left kernel, its blocks counted once), and each call of an emulated CUDA
    kernel outside it (``streamfx.emulate``; the CPU's own kernel is not counted there)."""
    from streamfx.runtime import LayerProgram

    calls, inside, merge, forward, regions = [], [], blocks._merge, emulate._forward, []

    def in_region(method):
        def run(self, *args, **kwargs):
            regions.append(1)
            try:
                return method(self, *args, **kwargs)
            finally:
                regions.pop()
        return run

    def counted_merge(*args, **kwargs):
        calls.append("blocks")
        inside.append(1)
        try:
            return merge(*args, **kwargs)
        finally:
            inside.pop()

    def counted_forward(*args, **kwargs):
        if regions and not inside:
            calls.append("kernel")
        return forward(*args, **kwargs)

    monkeypatch.setattr(blocks, "_merge", counted_merge)
    monkeypatch.setattr(emulate, "_forward", counted_forward)
    for name in ("forward", "backward"):
        monkeypatch.setattr(LayerProgram, name, in_region(getattr(LayerProgram, name)))
    return calls


def _run(monkeypatch, kernel, case, attention, dtype=torch.float32, codegen="eager"):
    name, make, _ = CASES[case]
    model, make_inputs = zoo.ZOO[name]()
    inputs = make(make_inputs)
    model = model.to(dtype)
    options = {"chunk_size": CHUNK, "head_chunk_size": CHUNK, "codegen": codegen, "strict": True,
               "attention": attention}
    forwards = _count_attention_forwards(monkeypatch)
    with kernel_context(kernel, codegen):
        run = run_eager_and_compiled(model, inputs, options)
    return run, forwards, model, inputs


# (kernel, case, whether the call's masks are exactly causal: the backward reads what was kept)
KEPT = [("cpu", "causal", True), ("cpu", "hf_causal", True), ("cpu", "left_pad", True),
        ("efficient", "hf_causal", True), ("cudnn", "causal", True), ("efficient", "left_pad", True),
        ("cpu", "gqa", True), ("flash", "causal", True), ("flash", "gqa", True), ("cudnn", "gqa", True),
        ("cpu", "packed", True), ("cudnn", "left_pad", True), ("efficient", "sliding", True)]
# the default run: each kernel, and each mask form (causal, padding, packed, window, grouped heads)
KEPT_DEFAULT = [("cpu", "causal"), ("cpu", "gqa"), ("cpu", "packed"), ("efficient", "left_pad"),
                ("flash", "causal"), ("cudnn", "left_pad"), ("efficient", "sliding")]
# the fast tier: the CPU kernel, a CUDA kernel's causal form and one under padding
KEPT_FAST = [("cpu", "causal"), ("cpu", "gqa"), ("flash", "causal")]


@pytest.mark.fast
@pytest.mark.parametrize("kernel,case,kept", cases(KEPT, [k for k in KEPT if k[:2] in KEPT_DEFAULT],
                                                 [k for k in KEPT if k[:2] in KEPT_FAST]),
                         ids=[f"{k[0]}-{k[1]}" for k in KEPT])
def test_kept_attention_runs_its_forward_once_and_is_exact(monkeypatch, kernel, case, kept):
    """Exact against eager; each chunk's attention forward runs once per step (twice under
    ``attention="recompute"``): causal as blocks or flash's own call, and with a data mask
    (padding, packed documents, a sliding window) the kernel's masked call, whose backward reads
    the kept output with the chunk's mask."""
    chunks = zoo.LAYERS * chunk_count(T, CHUNK)
    run, calls, _, _ = _run(monkeypatch, kernel, case, "keep")
    forwards = len(calls)
    said = [w for w in run.warnings if "its backward recomputes the attention" in w]
    assert len(said) == (0 if kept else zoo.LAYERS) and len(run.warnings) == len(said), run.warnings
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads, rtol=1e-5)
    assert run.counters["attention_kept"] == (chunks if kept else 0), run.counters
    # once per chunk where kept (a chunk's masked call on the CPU's own kernel is not counted),
    # twice where not
    counted = kernel != "cpu" or CASES[case][2] != "data"
    assert forwards == (0 if not counted else chunks if kept else 2 * chunks), calls
    assert all(p.keep is not None for p in run.programs if p.name.startswith("layer"))


@pytest.mark.parametrize("codegen", ["eager", "inductor"])
def test_kept_attention_of_rows_that_read_every_key(monkeypatch, codegen):
    """Rows that see no key under a finite mask fill (cuDNN's -65504 before torch 2.13, as on the
    GPU machine's torch 2.11; a float mask of finfo.min) are averaged over every key: a chunk of
    left padding reads keys past its own rows and runs its backward before the others. It reads
    the kept attention as every chunk does (it was called without the kept rows and failed)."""
    import dataclasses

    from streamfx.passes import kernels
    from streamfx.runtime import LayerProgram

    monkeypatch.setitem(kernels.BY_NAME, "cudnn",
                        dataclasses.replace(kernels.BY_NAME["cudnn"], bool_mask_fill=-65504.0))
    wide, key_ranges = [], LayerProgram.key_ranges

    def spy(self, inputs, bounds):
        ranges = key_ranges(self, inputs, bounds)
        wide.extend((s, e) for (s, e), (_, hi) in zip(bounds, ranges) if hi > e)
        return ranges

    monkeypatch.setattr(LayerProgram, "key_ranges", spy)
    run, _, _, _ = _run(monkeypatch, "cudnn", "left_pad", "keep", codegen=codegen)
    assert wide, "no chunk read keys past its rows: not the case under test"
    assert not run.warnings, run.warnings
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads, rtol=1e-5)
    assert run.counters["attention_kept"] == zoo.LAYERS * chunk_count(T, CHUNK), run.counters


@pytest.mark.fast
def test_recompute_runs_the_attention_forward_twice(monkeypatch):
    """The control of the test above: the default recomputes each chunk's attention."""
    chunks = zoo.LAYERS * chunk_count(T, CHUNK)
    run, forwards, _, _ = _run(monkeypatch, "cpu", "hf_causal", "recompute")
    assert len(forwards) == 2 * chunks and run.counters["attention_kept"] == 0
    assert_grads_match(run.ref_grads, run.grads, rtol=1e-5)


@pytest.mark.parametrize("kernel,case", [("cpu", "hf_causal"),
                                         pytest.param("cpu", "left_pad", marks=pytest.mark.extended),
                                         pytest.param("flash", "causal", marks=pytest.mark.extended),
                                         pytest.param("efficient", "left_pad", marks=pytest.mark.slow)])
def test_kept_attention_under_inductor(monkeypatch, kernel, case):
    chunks = zoo.LAYERS * chunk_count(T, CHUNK)
    run, forwards, _, _ = _run(monkeypatch, kernel, case, "keep", codegen="inductor")
    assert not run.warnings, run.warnings
    assert_grads_match(run.ref_grads, run.grads, rtol=1e-5)
    counted = kernel != "cpu" or CASES[case][2] != "data"
    assert run.counters["attention_kept"] == chunks and len(forwards) == (chunks if counted else 0), (
        run.counters, forwards)


@pytest.mark.slow
def test_kept_attention_bf16_within_eager_rounding(monkeypatch):
    """bf16: no further from the float64 gradients than twice eager bf16's own error."""
    run, _, model, inputs = _run(monkeypatch, "cpu", "hf_causal", "keep", dtype=torch.bfloat16)
    assert run.counters["attention_kept"] > 0
    ref64 = copy.deepcopy(model).double()
    inputs.loss_of(ref64(*inputs.args, **inputs.kwargs)).backward()
    exact = grads_of(ref64)
    for n, g in run.grads.items():
        if exact[n] is not None:
            own, ours = rel(run.ref_grads[n], exact[n]), rel(g, exact[n])
            assert ours <= 2 * own + 1e-6, f"{n}: streamed error {ours:.2e}, eager bf16's {own:.2e}"


@pytest.mark.fast
@pytest.mark.parametrize("kernel,model,why", [
    ("cpu", "qwen3_eager", "no fused attention"),     # matmul + softmax attention
    pytest.param("cpu", "mistral_sliding", "runs its masked query graph", marks=pytest.mark.heavy),  # masked calls not kept (below): window 5 < T
])
def test_keep_that_cannot_apply_says_why_and_stays_exact(monkeypatch, kernel, model, why):
    """A layer with no fused attention keeps nothing (said at compile time); where only the
    exactly causal variant keeps (a kernel whose backward would not take the mask), a call whose
    masks are not exactly causal recomputes (said at the first such call)."""
    from streamfx.passes import kernels

    monkeypatch.setattr(kernels.Kernel, "keeps_masked", property(lambda self: False))
    m, make_inputs = zoo.ZOO[model]()
    inputs = make_inputs(zoo.Case("t", 2, T))
    with kernel_context(kernel):
        run = run_eager_and_compiled(m, inputs, {"chunk_size": CHUNK, "attention": "keep"})
    said = [w for w in run.warnings if "attention='keep'" in w]
    assert said and why in said[0] and "recomputes the attention" in said[0], run.warnings
    assert run.counters["attention_kept"] == 0 and run.counters["chunks_backward"] > 0
    assert_grads_match(run.ref_grads, run.grads, rtol=1e-5)


@pytest.mark.fast
@pytest.mark.expect_fallback
def test_forward_run_whole_keeps_its_attention_for_the_streamed_backward(monkeypatch):
    """A layer whose forward falls back to its whole graph (a chunk failed) keeps the whole
    attention's output and log-sum-exp; the streamed backward reads them: exact."""
    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    _failing_chunk(monkeypatch, RuntimeError("a chunk that does not run"), train=False, at=1, region="layer.0")
    model, make_inputs = zoo.tiny_llama()
    inputs = make_inputs("odd13")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = run_eager_and_compiled(model, inputs, {"chunk_size": 5, "attention": "keep"})
    assert any("could not run chunk by chunk" in w for w in run.warnings), run.warnings
    assert run.counters["region_fallbacks"] == 1, run.counters
    assert run.counters["attention_kept"] == zoo.LAYERS * 3, run.counters
    assert_grads_match(run.ref_grads, run.grads, rtol=1e-5)


@pytest.mark.fast
@pytest.mark.parametrize("options,match", [
    ({"attention": "always"}, r"option 'attention' must be one of \('recompute', 'keep'\)"),
    ({"attention": "keep", "offload": "cpu"}, r"drop offload='cpu'"),
    ({"attention": "keep", "keep_every": 2}, r"drop keep_every=2"),
    ({"attention": "keep", "offload": "auto", "memory_budget": "1GiB"}, r"drop offload='auto'"),
])
def test_bad_attention_options_raise(options, match):
    model, make_inputs = zoo.tiny_llama()
    inputs = make_inputs("odd13")
    compiled = torch.compile(model, backend="streambp", options=options)
    with pytest.raises(Exception, match=match) as info:
        compiled(*inputs.args)
    err = info.value
    while not isinstance(err, StreamBPError) and err.__cause__ is not None:
        err = err.__cause__
    assert isinstance(err, StreamBPError), type(info.value)


@pytest.mark.heavy
def test_memory_model_counts_the_kept_attention():
    """``explain()``'s step peak with ``attention="keep"`` holds every layer's kept output and
    log-sum-exp until its backward, named as such."""
    import streamfx

    model, make_inputs = zoo.ZOO["qwen3_sdpa"]()
    inputs = make_inputs(zoo.Case("t", 2, T))
    reports = {a: streamfx.explain(model, *inputs.args, options={"chunk_size": CHUNK, "attention": a}, dynamic=False,
                                   **inputs.kwargs) for a in ("recompute", "keep")}
    text = str(reports["keep"])
    assert "attention output kept for the backward" in text or "attention kept for the backward" in text, text
    B, H, D = 2, zoo.HEADS, zoo.HEAD_DIM
    kept = zoo.LAYERS * (B * H * T * D * 4 + B * H * T * 4)
    grown = reports["keep"].memory()[3] - reports["recompute"].memory()[3]
    assert 0.5 * kept <= grown <= 1.5 * kept, (grown, kept)


def test_kept_attention_at_later_lengths_and_batch_sizes():
    """One compile, then calls at other lengths and batch sizes (Dynamo's symbolic recompile),
    a padded call among them (the masked variant, kept too): every call exact."""
    from streamfx.runtime import COUNTERS

    model, make_inputs = zoo.ZOO["qwen3_sdpa"]()
    mine = copy.deepcopy(model)
    compiled = torch.compile(mine, backend="streambp",
                             options={"chunk_size": CHUNK, "attention": "keep", "strict": True, "codegen": "eager"})
    for B, length, pad, kept in [(2, T, None, True), (2, 31, None, True), (3, 19, None, True),
                                 (2, 22, "left", True), (1, 27, None, True)]:
        inputs = make_inputs(zoo.Case("t", B, length, pad=pad))
        ref = copy.deepcopy(model)
        inputs.loss_of(ref(*inputs.args, **inputs.kwargs)).backward()
        mine.zero_grad(set_to_none=True)
        before = COUNTERS["attention_kept"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            inputs.loss_of(compiled(*inputs.args, **inputs.kwargs)).backward()
        said = [str(w.message) for w in caught if "attention='keep'" in str(w.message)]
        assert len(said) == (0 if kept else zoo.LAYERS) and all(f"(T={length})" in w for w in said), said
        assert_grads_match(grads_of(ref), grads_of(mine), rtol=1e-5)
        assert COUNTERS["attention_kept"] - before == (zoo.LAYERS * chunk_count(length, CHUNK) if kept else 0)


@pytest.mark.fast
def test_kept_attention_in_layers_compiled_alone():
    """One graph per decoder layer (``layer.compile``, as FSDP2 and ZeRO-3 users compile): each
    layer keeps its own attention, with its mask arriving as a graph input, exact."""
    from test_pieces import OPTIONS, compare

    model, make_inputs = zoo.qwen3()
    ref = copy.deepcopy(model)
    for layer in model.model.layers:
        layer.compile(backend="streambp", options={**OPTIONS, "attention": "keep", "strict": True})
    ran, messages = compare(ref, model, make_inputs("odd17"))
    assert not messages, messages
    chunks = zoo.LAYERS * chunk_count(17, OPTIONS["chunk_size"])
    assert ran["region_backward"] == zoo.LAYERS and ran["attention_kept"] == chunks, ran


def _budget_case(T: int = 512, trace: int = 64):
    """The zoo's Qwen3, the inputs of a batch of one at length T, and the memory reports of
    attention "recompute" and "keep" (eager chunk graphs, traced at ``trace`` tokens)."""
    import streamfx

    model, make_inputs = zoo.qwen3("sdpa")
    inputs = make_inputs(zoo.Case("budget", 1, T))
    short = {k: v[:, :trace] for k, v in inputs.kwargs.items()}
    opts = {"codegen": "eager"}
    reports = {a: streamfx.plan_memory(model, **short, options={**opts, "attention": a}) for a in ("recompute", "keep")}
    return model, inputs, reports


@pytest.mark.heavy
def test_a_memory_budget_sizes_chunks_with_the_kept_attention_counted():
    """attention="keep" with a memory_budget: the memory model holds every layer's kept output and
    log-sum-exp until its backward (layers x T x heads x (head_dim + 1) x 4 bytes above
    "recompute" at the same chunks), each call runs the largest chunks that fit with them (here
    smaller than "recompute" would run under the same budget), layer inputs stay on the device,
    and the step reads what was kept and is exact."""
    T, c = 512, 64
    model, inputs, reports = _budget_case(T)
    cfg = model.config
    kept = cfg.num_hidden_layers * T * cfg.num_attention_heads * (cfg.head_dim + 1) * 4
    keep, recompute = reports["keep"], reports["recompute"]
    for cc in (c, 2 * c, 4 * c):
        assert keep.model.peak(T, cc, cc) - recompute.model.peak(T, cc, cc) == kept, cc
    # halfway between keep's peaks at chunks of c and 2c (the step's own held bytes include its inputs)
    budget = keep.held + (keep.model.peak(T, c, c) + keep.model.peak(T, 2 * c, c)) // 2
    assert keep.chunks(T, budget)[0] == c < recompute.chunks(T, budget)[0]
    assert keep.storage(T, budget) is None

    run = run_eager_and_compiled(model, inputs, {"attention": "keep", "memory_budget": budget, "strict": True})
    layers = [p for p in run.programs if p.kind == "layer"]
    assert layers and all(p.keep is not None and p.policy is not None for p in layers)
    policy = layers[0].policy
    assert policy.sizes(T)[0] == c and policy.storage(T) == (None, 1)
    assert run.counters["attention_kept"] == cfg.num_hidden_layers * T // c, run.counters
    assert run.counters["region_fallbacks"] == 0, run.counters
    assert_grads_match(run.ref_grads, run.grads, rtol=1e-5)


# (extended: the default run has kept attention under a budget in test_a_memory_budget_sizes_chunks_with_the_kept_attention_counted)
@pytest.mark.extended
def test_a_budget_the_kept_attention_does_not_fit_raises_before_the_step():
    """Under a budget that "recompute" fits at the smallest chunks and "keep" does not, the call
    raises StreamBPError before any chunk runs, with the longest length that fits and what
    attention="keep" holds."""
    from streamfx.runtime import COUNTERS
    from streamfx.passes.schedule import MIN_CHUNK

    T = 512
    model, inputs, reports = _budget_case(T)
    smallest = {a: r.held + r.model.peak(T, MIN_CHUNK, MIN_CHUNK) for a, r in reports.items()}
    budget = (smallest["recompute"] + smallest["keep"]) // 2
    assert reports["recompute"].chunks(T, budget)[0] >= MIN_CHUNK
    compiled = torch.compile(copy.deepcopy(model), backend="streambp",
                             options={"codegen": "eager", "attention": "keep", "memory_budget": budget})
    before = COUNTERS["chunks_forward"]
    with pytest.raises(StreamBPError, match=r"longest sequence that fits is \d+ tokens \(attention='keep' holds"):
        compiled(**inputs.kwargs)
    assert COUNTERS["chunks_forward"] == before
