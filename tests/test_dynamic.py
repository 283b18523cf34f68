"""Every length, every batch, any data: one compiled model through a sequence of calls.

Each call runs the compiled model and an eager copy with the same weights on the same inputs
and compares the loss and every gradient. Each call must stream every layer and the head
(runtime counters), and the number of backend and chunk-graph compiles is asserted: the first
shape compiles statically, the next one with symbolic sizes (Dynamo's automatic dynamic
shapes), and that compile serves every later length and batch size.
"""
import copy
import itertools
import warnings

import pytest
import torch
from hypothesis import given, strategies as st

import streamfx
import zoo
from tiers import cases, compiling
from conftest import assert_grads_match
from streamfx.backend import streambp_backend
from streamfx.runtime import COUNTERS
from streamfx.passes.compat import TORCH
from streamfx.passes.schedule import chunk_count

# torch 2.11's C++ code generation fails on a few chunk graphs (Falcon's rotary backward under
# symbolic sizes: a transposed store indexed by a value loaded in a loop it is not declared in, a
# g++ error in Inductor's own code); the chunk graph then runs as an FX graph, exact, and warned.
# The GPU's code generation (Triton) has no such path.
CPP_CODEGEN_FAULT = "Inductor could not compile it (InductorError: CppCompileError"


class Calls:
    """A compiled model and its eager twin; ``call`` runs one step on both and checks it."""

    def __init__(self, name, codegen="eager", chunk_size=5, head_chunk_size=4, **model_kwargs):
        factory = (zoo.ZOO.get(name) or getattr(zoo, name)) if isinstance(name, str) else name
        self.model, self.make_inputs = factory(**model_kwargs)
        if name == "gpt2":
            self.model.loss_type = "ForCausalLM"
        self.ref = copy.deepcopy(self.model)
        self.layers = zoo.LAYERS
        self.compiles = 0
        options = {"codegen": codegen, "chunk_size": chunk_size, "head_chunk_size": head_chunk_size}

        def backend(gm, example_inputs):
            self.compiles += 1
            return streambp_backend(gm, example_inputs, options=options)

        self.compiled = torch.compile(self.model, backend=backend)

    def call(self, inputs):
        self.model.zero_grad(set_to_none=True)
        self.ref.zero_grad(set_to_none=True)
        before = dict(COUNTERS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = inputs.loss_of(self.compiled(*inputs.args, **inputs.kwargs))
            loss.backward()
        ref_loss = inputs.loss_of(self.ref(*inputs.args, **inputs.kwargs))
        ref_loss.backward()
        torch.testing.assert_close(loss.detach(), ref_loss.detach(), rtol=1e-5, atol=1e-6)
        ref_grads = {n: p.grad for n, p in self.ref.named_parameters()}
        grads = {n: p.grad for n, p in self.model.named_parameters()}
        # a gradient that is zero up to rounding (queries and keys when every token attends to
        # itself alone) is compared absolutely, against the largest gradient of the model
        scale = max(g.abs().max().item() for g in ref_grads.values() if g is not None)
        for n, g in list(ref_grads.items()):
            if g is not None and g.abs().max().item() < 1e-6 * scale:
                torch.testing.assert_close(grads[n], g, rtol=0, atol=1e-6 * scale, msg=n)
                ref_grads.pop(n), grads.pop(n)
        assert_grads_match(ref_grads, grads)
        ran = {k: COUNTERS[k] - before[k] for k in COUNTERS}
        messages = [str(w.message) for w in caught if "streamfx" in str(w.message)]
        faults = [m for m in messages if TORCH < (2, 13) and CPP_CODEGEN_FAULT in m]
        messages = [m for m in messages if m not in faults]
        assert not messages, messages
        # every layer and the head streamed, forward and backward
        assert ran["region_forward"] == self.layers + 1 and ran["region_backward"] == self.layers + 1, ran
        ran["cpp_codegen_faults"] = len(faults)
        return ran


def hf_inputs(calls, B, T, pad=None, n_pad=3, ignore=None, seed=0, **extra):
    """A trainer's batch: input ids, labels and always an attention mask (all ones without padding)."""
    case = zoo.Case("t", B, T, pad=pad, n_pad=n_pad, ignore=ignore, seed=seed)
    ids, mask, labels = zoo.tokens(case, zoo.VOCAB)
    kwargs = dict(input_ids=ids, labels=labels, attention_mask=mask, **extra)
    return zoo.Inputs((), kwargs, case, lambda o: o.loss, lambda o: o.logits, zoo.VOCAB)


# lengths below and above the chunk size (5), odd and even; batch sizes 2-4 (a batch of one is
# specialised by Dynamo: see test_batch_of_one_and_lengths_below_two)
SHAPES = [(2, 12), (3, 17), (2, 9), (4, 16), (3, 21), (2, 4), (4, 13), (3, 24), (2, 11), (4, 6)]


def loop(calls, shapes, inputs_of, counted="chunk_compiles"):
    """Each call's count of ``counted`` (a ``COUNTERS`` key, or several: a tuple per call)."""
    out = []
    for i, (B, T) in enumerate(shapes):
        ran = calls.call(inputs_of(calls, B, T, i))
        out.append(ran[counted] if isinstance(counted, str) else tuple(ran[k] for k in counted))
    return out


def varied(calls, B, T, i):
    """Padding on either side and a prompt span, changing from call to call."""
    pad = [None, "left", "right"][i % 3]
    return hf_inputs(calls, B, T, pad=pad, n_pad=min(3, T - 1), ignore=(1, min(3, T)) if i % 2 else None, seed=i)


def plain(calls, B, T, i):
    """A plain model's (ids, labels), with a prompt span on every other call."""
    return calls.make_inputs(zoo.Case("t", B, T, ignore=(1, min(3, T)) if i % 2 else None, seed=i))


@pytest.mark.parametrize("name", cases(zoo.HF_MODELS, ["qwen3_sdpa", "gpt2"]))
def test_hf_zoo_every_length_and_batch(name):
    """Ten lengths, three batch sizes, changing padding: two backend compiles, every call exact
    and streamed."""
    calls = Calls(name)
    loop(calls, SHAPES, varied)
    assert calls.compiles == 2


@pytest.mark.fast
@pytest.mark.heavy
@pytest.mark.parametrize("name", ["nanogpt", pytest.param("tiny_llama", marks=pytest.mark.extended),
                                  pytest.param("tiny_llama_logit_shift", marks=pytest.mark.heavy)])
def test_plain_zoo_every_length_and_batch(name):
    """A loss on ``logits[:, :-1]`` too: its head computes on a slice of a symbolic length."""
    calls = Calls(name)
    loop(calls, SHAPES, plain)
    assert calls.compiles == 2


# ---- attention forms and mixture-of-experts --------------------------------------------------------
FORMS = ["sinks", "alibi", "chunked", "mla", "falcon", "bloom", "qwen3_moe"]
# transformers < 5.24: Qwen3-MoE's fp32 expert products do not stream (tests/test_untraceable.py)
MOE_BEFORE_5_24 = pytest.mark.skipif(not zoo.moe_streams(), reason="transformers < 5.24: grouped_mm_fallback's "
                                     "backward reads offs.tolist(); tests/test_untraceable.py checks the refusal")


def forms(names):
    """``names`` (or their parameters) with Qwen3-MoE skipped before transformers 5.24."""
    out = []
    for n in names:
        p = n if hasattr(n, "values") else pytest.param(n)
        out.append(pytest.param(*p.values, marks=[*p.marks, MOE_BEFORE_5_24], id=p.id)
                   if p.values == ("qwen3_moe",) else p)
    return out


def forms_loop(name, shapes, codegen):
    """One compiled model of an attention form (test_architectures.py) or the top-2 MoE
    (test_moe.py) over calls of changing length, batch size and masks: every call exact, every
    layer and the head streamed, each layer in ceil(T / 5) chunks."""
    calls = Calls(zoo.FORMS.get(name) or getattr(zoo, name), codegen=codegen)
    hf = name in ("falcon", "bloom", "qwen3_moe")
    chunk_compiles = []
    for i, (B, T) in enumerate(shapes):
        ran = calls.call((varied if hf else plain)(calls, B, T, i))
        head = ran["chunks_forward"] - calls.layers * chunk_count(T, 5)
        assert head in (chunk_count(T, 4), chunk_count(T - 1, 4)), (name, B, T, ran)  # head chunks of 4 over T or T - 1 rows
        chunk_compiles.append(ran["chunk_compiles"])
        assert ran["chunk_compile_failures"] == ran["cpp_codegen_faults"], ran
    assert calls.compiles == 2
    return chunk_compiles


@pytest.mark.parametrize("name", forms(cases(FORMS, ["sinks", "alibi", "qwen3_moe"])))
def test_forms_every_length_and_batch(name):
    """Sinks, ALiBi (plain and Bloom's), chunked attention, MLA, Falcon's head index and the
    MoE dispatch, whose key ranges, biases and expert groups all follow the symbolic length."""
    forms_loop(name, SHAPES[:8], "eager")


@pytest.mark.slow
@pytest.mark.parametrize("name", forms(cases(FORMS, [])))
def test_forms_every_length_inductor(name):
    """Under Inductor: the static first shape, then the symbolic compile, whose chunk graphs
    serve the later lengths and batch sizes without compiling. (Falcon runs on one intra-op
    thread: Inductor on CPU, torch 2.13.0, miscompiles Falcon's backward with more than one,
    1.8e-2 gradient error with plain ``backend="inductor"`` and no streamfx; with one thread
    both are exact.)"""
    from streamfx import runtime

    runtime.clear_caches()
    threads = torch.get_num_threads()
    if name == "falcon":
        torch.set_num_threads(1)
    try:
        chunk_compiles = forms_loop(name, SHAPES[:8], "inductor")
    finally:
        torch.set_num_threads(threads)
    assert chunk_compiles[0] > 0 and chunk_compiles[2:] == [0] * 6, chunk_compiles


def test_batch_of_one():
    """B=1 is a size Dynamo specialises (0/1 specialisation): it gets a graph of its own, which
    streams too."""
    calls = Calls("qwen3_sdpa")
    loop(calls, [(2, 12), (3, 9), (1, 7), (1, 12), (3, 14)], varied)
    assert calls.compiles == 3


@pytest.mark.fast
def test_one_token_runs_exactly_and_says_why_nothing_streams():
    """T=1 (a one-token batch, as in RL): exact, and a warning says there is nothing to stream."""
    model, make_inputs = zoo.qwen3_sdpa()
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager"})
    ids = torch.randint(1, zoo.VOCAB, (2, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        logits = compiled(input_ids=ids).logits
    logits.square().sum().backward()
    ref_logits = ref(input_ids=ids).logits
    ref_logits.square().sum().backward()
    torch.testing.assert_close(logits, ref_logits)
    # (with one key, the gradients of the queries and keys are zero up to rounding: compared absolutely)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    assert any("one token" in str(w.message) for w in caught), [str(w.message) for w in caught]


@pytest.mark.fast
@pytest.mark.parametrize("backend", ["streambp"] + [pytest.param(b, marks=pytest.mark.heavy)
                                                  for b in ("strict", "streamfx.backend", "aot_eager")])
def test_a_call_past_dynamos_recompile_limit_says_it_does_not_stream(backend):
    """Under dynamic=False every new length compiles again; once a function holds
    ``recompile_limit`` compiled graphs Dynamo runs a call that fits none of them eagerly without
    calling the backend: exact, and unstreamed. A streamfx compile says so once, naming the
    model, the limit, the last recompile's reason and the remedy (strict=True raises it); another
    backend's compile is not streamfx's to speak for."""
    model, make_inputs = zoo.nanogpt()
    ref = copy.deepcopy(model)
    if backend == "streamfx.backend":
        compiler = dict(backend=streamfx.backend(codegen="eager"))
    elif backend == "aot_eager":
        compiler = dict(backend="aot_eager")
    else:
        compiler = dict(backend="streambp", options={"codegen": "eager", "strict": backend == "strict"})
    compiled = torch.compile(model, dynamic=False, **compiler)
    with torch._dynamo.config.patch(recompile_limit=2), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for T in (9, 10, 11, 12):
            inputs = make_inputs(zoo.Case("t", 1, T))
            before = dict(COUNTERS)
            for m, f in ((ref, ref), (model, compiled)):
                m.zero_grad(set_to_none=True)
            ref_loss = inputs.loss_of(ref(*inputs.args, **inputs.kwargs))
            ref_loss.backward()
            try:
                loss = inputs.loss_of(compiled(*inputs.args, **inputs.kwargs))
            except streamfx.StreamBPError as e:
                assert backend == "strict" and T == 11, (backend, T)
                said = [str(e)]
                break
            loss.backward()
            torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
            assert_grads_match({n: p.grad for n, p in ref.named_parameters()},
                               {n: p.grad for n, p in model.named_parameters()}, rtol=1e-5)
            streamed = COUNTERS["region_forward"] > before.get("region_forward", 0)
            assert streamed == (backend != "aot_eager" and T < 11), (backend, T)
        else:
            said = [str(w.message) for w in caught if "streamfx" in str(w.message)]
    if backend == "aot_eager":
        assert not said, said
        return
    assert len(said) == 1, said
    assert "recompile_limit (2)" in said[0] and "NanoGPT's forward" in said[0] and "does not stream" in said[0], said
    assert "size mismatch" in said[0] and "dynamic=None" in said[0], said


def inductor_loop(name):
    """Under Inductor the chunk graphs of the dynamic compile serve every later length and
    batch size: no chunk graph compiles after the second call, nor compiles again for a call's
    sizes (lengths of 16 and 21 leave one token after chunks of 5, 9, 13, 17 and 21 after the head's
    chunks of 4: a chunk of one row would break the compiles' guards; it joins the chunk before).
    (The caches start empty: a mask whose key ranges an earlier test cached would compile its
    mask graph late.)"""
    from streamfx import runtime

    runtime.clear_caches()
    calls = Calls(name, codegen="inductor")
    counts = loop(calls, SHAPES[:8], varied if name in zoo.HF_MODELS else plain, ("chunk_compiles", "guard_recompiles"))
    assert calls.compiles == 2
    assert counts[0][0] > 0 and counts[1][0] > 0, counts
    assert all(c == (0, 0) for c in counts[2:]), counts


# Under Inductor the default run keeps one model's every-length loop (below); every model and
# attention form runs it under eager codegen (above), and under Inductor in the extended tier.
@pytest.mark.parametrize("name", cases(["qwen3_sdpa", "mistral_sliding"], ["mistral_sliding"]))
def test_inductor_chunk_graphs_compile_once_for_every_length(name):
    inductor_loop(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", cases(["qwen3_eager", "llama_tied", "gemma3", "gpt2", "nanogpt", "tiny_llama",
                                        "tiny_llama_logit_shift"], []))
def test_inductor_every_length_rest_of_zoo(name):
    """The rest of the zoo's every-length loop under Inductor (eager attention with its mask
    arithmetic, a tied head, Gemma3's sliding layer and softcapped logits, GPT-2's learned
    positions, plain PyTorch models, a loss on ``logits[:, :-1]``)."""
    inductor_loop(name)


def test_automatic_chunk_size_follows_the_length():
    """chunk_size=None: the schedule is computed per call from the real length."""
    def long_llama():
        torch.manual_seed(0)
        return zoo.TinyLlama(max_pos=512).train(), zoo._plain_inputs(zoo.VOCAB)

    calls = Calls(long_llama, chunk_size=None, head_chunk_size=None)
    schedules = []
    for B, T in [(2, 70), (2, 300), (3, 130)]:
        ran = calls.call(calls.make_inputs(zoo.Case("t", B, T)))
        schedules.append(ran["chunks_backward"])
    # layers: ceil(T / auto_chunk(T)) chunks each (auto: T/4, at least 64); the head: one chunk
    from streamfx.passes.schedule import auto_chunk
    assert schedules == [zoo.LAYERS * chunk_count(T, auto_chunk(T)) + 1 for T in (70, 300, 130)]


def test_automatic_chunks_above_512_tokens_are_exact():
    """Past T = 2048 the automatic layer chunk exceeds 512 tokens (T/4 rounded up: 1,025 at
    T = 4099, the last chunk one token shorter): loss and every gradient match eager."""
    def long_llama():
        torch.manual_seed(0)
        return zoo.TinyLlama(max_pos=4160).train(), zoo._plain_inputs(zoo.VOCAB)

    from streamfx.passes.schedule import auto_chunk
    T = 4099
    assert auto_chunk(T) == 1025
    calls = Calls(long_llama, chunk_size=None, head_chunk_size=None)
    ran = calls.call(calls.make_inputs(zoo.Case("t", 1, T)))
    assert ran["chunks_backward"] == zoo.LAYERS * 4 + 1   # per layer 3 x 1,025 + 1,024 tokens; the head: one


# ---- data: masks hold for any data, in any order ---------------------------------------------------
def packed(calls, B, T, starts, seed=0):
    """Documents packed into each row: position ids restart at each start (no attention mask)."""
    pos = torch.zeros(B, T, dtype=torch.long)
    for s, e in zip(starts, list(starts[1:]) + [T]):
        pos[:, s:e] = torch.arange(e - s)
    case = zoo.Case("t", B, T, seed=seed)
    ids, _, labels = zoo.tokens(case, zoo.VOCAB)
    return zoo.Inputs((), dict(input_ids=ids, labels=labels, position_ids=pos), case, lambda o: o.loss,
                      lambda o: o.logits, zoo.VOCAB)


T_DATA = 16
MASK_DATA = {
    "padding": [lambda c: hf_inputs(c, 2, T_DATA), lambda c: hf_inputs(c, 2, T_DATA, pad="left", n_pad=6),
                lambda c: hf_inputs(c, 2, T_DATA, pad="right", n_pad=9)],
    "all-masked rows": [lambda c: hf_inputs(c, 2, T_DATA, pad="left", n_pad=15),
                        lambda c: hf_inputs(c, 2, T_DATA)],
    "prompt": [lambda c: hf_inputs(c, 2, T_DATA, ignore=(0, 9)), lambda c: hf_inputs(c, 2, T_DATA, ignore=(5, 6))],
    "packed": [lambda c: packed(c, 2, T_DATA, list(range(T_DATA))),       # every token its own document
               lambda c: packed(c, 2, T_DATA, [0]),                       # one document
               lambda c: packed(c, 2, T_DATA, [0, 3, 11])],
}


@pytest.mark.parametrize("kind, name", cases(
    [(k, n) for k in MASK_DATA for n in ("mistral_sliding", "qwen3_eager")],
    [(k, ("mistral_sliding", "qwen3_eager")[i % 2]) for i, k in enumerate(MASK_DATA)]))
def test_any_order_of_data_is_exact(name, kind):
    """For each mask kind, every call order (each variant first, then the others) is exact:
    the mask's pattern comes from the graph, never from the first call's data."""
    variants = MASK_DATA[kind]
    for order in itertools.permutations(range(len(variants))):
        torch._dynamo.reset()
        calls = Calls(name)
        for i in order:
            calls.call(variants[i](calls))


@pytest.mark.fast
def test_sliding_window_pattern_is_read_from_the_graph():
    """Mistral with a window of 5, compiled on a call whose position ids restart at every token:
    the analysis still finds the sliding window (from the graph, not from this call's data), and
    the mask's data inputs are read per call."""
    model, _ = zoo.mistral_sliding()
    inputs = packed(None, 2, T_DATA, list(range(T_DATA)))
    report = streamfx.explain(model, options={"chunk_size": 5}, **inputs.kwargs)
    sites = report.attention_sites
    assert sites and all((s.mask_kind, s.window) == ("sliding-window", 5) for s in sites), \
        [s.describe() for s in sites]
    assert all(s.data for s in sites)


@pytest.mark.fast
def test_user_mask_that_sees_later_keys_runs_exactly():
    """A 4-D mask given by the user that lets queries see later keys (a prefix-LM: the first 6
    tokens see each other): the chunks that need later keys read them, exactly."""
    calls = Calls("qwen3_sdpa")
    B, T = 2, T_DATA
    base = hf_inputs(calls, B, T)
    allowed = torch.ones(T, T, dtype=torch.bool).tril()
    allowed[:6, :6] = True
    mask = torch.zeros(B, 1, T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)
    base.kwargs["attention_mask"] = mask
    calls.call(base)
    base.kwargs["attention_mask"] = torch.zeros(B, 1, T, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(),
                                                                        torch.finfo(torch.float32).min)
    calls.call(base)


# ---- a property: any sequence of calls --------------------------------------------------------------
call_strategy = st.tuples(st.integers(2, 3), st.integers(2, 20), st.sampled_from([None, "left", "right", "packed"]),
                          st.integers(1, 8))


class AutomaticDynamic:
    """The compiles Dynamo's automatic dynamic shapes make for a sequence of calls, when nothing but
    the sizes of the inputs is guarded: a call that no compiled graph accepts (same inputs, same
    sizes where the graph is static) compiles; a size that differs from the one recorded for its
    input and dim becomes dynamic from then on."""

    def __init__(self):
        self.seen: dict = {}       # (input, dim) -> the recorded size, None once dynamic
        self.graphs: list = []     # (input names, {(input, dim): static size})
        self.compiles = 0

    def call(self, kwargs: dict):
        names = tuple(sorted(kwargs))
        sizes = {(k, d): s for k, v in kwargs.items() if isinstance(v, torch.Tensor) for d, s in enumerate(v.shape)}
        if any(n == names and all(sizes[key] == s for key, s in static.items()) for n, static in self.graphs):
            return
        for key, s in sizes.items():
            if key in self.seen and self.seen[key] != s:
                self.seen[key] = None
            self.seen.setdefault(key, s)
        self.graphs.append((names, {key: s for key, s in sizes.items() if self.seen[key] is not None}))
        self.compiles += 1


@compiling(3)  # (a failing sequence is short already)
@given(st.lists(call_strategy, min_size=2, max_size=4))
def test_any_sequence_of_calls(sequence):
    torch._dynamo.reset()
    calls = Calls("mistral_sliding")
    dynamo = AutomaticDynamic()
    for i, (B, T, pad, n) in enumerate(sequence):
        if pad == "packed":
            inputs = packed(calls, B, T, sorted({0} | {min(T - 1, n), min(T - 1, 2 * n)}), seed=i)
        else:
            inputs = hf_inputs(calls, B, T, pad=pad, n_pad=min(n, T - 1), seed=i)
        dynamo.call(inputs.kwargs)
        calls.call(inputs)
    # no more compiles than Dynamo's automatic dynamic shapes need (a static compile of each set of
    # inputs, then one each time a size seen static changes): none per new length or batch size
    assert calls.compiles <= dynamo.compiles, (calls.compiles, dynamo.compiles)


def test_main_example_later_lengths_stream(monkeypatch):
    """The main example's model (one row, a prompt of ignored labels): the symbolic compile a
    second length gets makes Dynamo restart its analysis once (a Python float of the symbolic
    length becomes a tensor); the restart is Dynamo's control flow, never a failure, so that
    compile streams every layer and the head, with no warning. (Run as users run it: without
    STREAMFX_VERIFY, which re-raises every exception and would hide a restart taken for a
    failure.)"""
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    from train_qwen3 import batch, build

    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    ids, labels = batch(64, 4096, prompt=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = streamfx.explain(build(), input_ids=ids, labels=labels, options={"chunk_size": 16, "codegen": "eager"})
    later = report.later_lengths
    assert later is not None
    assert {p.name for p in later.plan} == {"layer.0", "layer.1", "layer.2", "layer.3", "head"}, later
    # each symbol of the schedule named by the input size Dynamo bound it from
    shown = "\n".join(p.describe(names=False) for p in later.plan)
    assert "(input_ids.size(0))" in shown and "(a size)" not in shown, shown
    assert not [str(w.message) for w in caught if "streamfx" in str(w.message)]


def _symbolic_graphs(seen: list):
    """A backend recording, per graph it compiles, whether an input has a symbolic size."""
    from torch.fx.experimental.symbolic_shapes import free_symbols

    def backend(gm, example_inputs):
        seen.append(any(free_symbols(n.meta.get("example_value")) for n in gm.graph.find_nodes(op="placeholder")))
        return gm.forward
    return backend


@pytest.mark.fast
@pytest.mark.heavy
def test_explain_and_the_users_compiles_leave_each_other_their_sizes():
    """Dynamo turns a size symbolic where a function's calls have seen it change, remembered per
    function for the whole process. explain() compiles as the model's first compile does, whatever
    the process compiled before, and the sizes it saw do not make the user's first compile
    symbolic."""
    model, make_inputs = zoo.qwen3()
    short, long = make_inputs(zoo.Case("t16", 2, 16)), make_inputs(zoo.Case("t24", 2, 24))
    report = streamfx.explain(model, *short.args, **short.kwargs)
    assert report.seq_dim == [16], report.seq_dim
    seen = []
    compiled = torch.compile(model, backend=_symbolic_graphs(seen))
    compiled(*long.args, **long.kwargs)
    assert seen == [False], seen                 # the user's first compile: static sizes
    compiled(*short.args, **short.kwargs)
    assert seen == [False, True], seen           # their second length: symbolic
    report = streamfx.explain(model, *short.args, **short.kwargs)
    assert report.seq_dim == [16], report.seq_dim  # still the first compile's static sizes


# (extended: the default run has later lengths in test_main_example_later_lengths_stream, graph pieces in test_pieces.py)
@pytest.mark.extended
def test_later_lengths_of_a_model_in_graph_pieces_are_its_recompiles():
    """A graph break between the decoder and the LM head: the head's graph is a resumed frame
    whose local ``logits_to_keep`` (0) never changes, so a later length recompiles it with a
    symbolic length and that int as it is: the head streams at every length. explain's later
    lengths say the same (compiling every size and int symbolic would slice the head's input at a
    symbolic bound and refuse it), and the run agrees."""
    model, make_inputs = zoo.qwen3()

    def graph_break(module, args, out):
        torch._dynamo.graph_break()
        return out

    model.model.register_forward_hook(graph_break)
    inputs = make_inputs("right_pad")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = streamfx.explain(model, *inputs.args, **inputs.kwargs)
        later = report.later_lengths
    assert not [str(w.message) for w in caught if "streamfx" in str(w.message)]
    assert len(report.seq_dim) == 2 and {p.name for p in report.plan} == {"layer.0", "layer.1", "head"}, report
    assert {p.name for p in later.plan} == {"layer.0", "layer.1", "head"} and not later.not_streamed, str(report)
    assert all(isinstance(n, torch.SymInt) for n in later.seq_dim), later.seq_dim
    calls = Calls(zoo.qwen3, head_chunk_size=4)
    calls.model.model.register_forward_hook(graph_break)
    calls.ref = copy.deepcopy(calls.model)
    for case in [zoo.Case("a", 2, 16, pad="right"), zoo.Case("b", 3, 11, pad="left")]:
        calls.call(make_inputs(case))


def test_trl_grpo_every_length_and_completion_length():
    """TRL's GRPO loss (``logits_to_keep=K + 1``, the logits shifted by one, a per-row logsumexp
    stack) over calls whose prompt length T and completion length K both change: once Dynamo
    makes K a symbol, HF's ``hidden[:, -K - 1:]`` is a slice with a symbolic start. The last
    layer still ends before it, the logits shift still moves onto it, and the head streams
    over the K tokens of every call."""
    from test_head_streaming import TRLGRPOLoss

    def factory():
        model, _ = zoo.qwen3_sdpa()
        return TRLGRPOLoss(model), None

    calls = Calls(factory)
    g = torch.Generator().manual_seed(3)
    for i, (B, T, K) in enumerate([(2, 16, 10), (3, 19, 7), (2, 13, 9), (3, 24, 12), (2, 11, 5)]):
        ids = torch.randint(1, zoo.VOCAB, (B, T), generator=g)
        attention_mask = torch.ones(B, T, dtype=torch.long)
        attention_mask[1, :i % 3] = 0
        completion_mask = torch.ones(B, K)
        completion_mask[0, -2:] = 0
        old = torch.randn(B, K, generator=g) * 0.3 - 4
        args = (ids, attention_mask, completion_mask, old, torch.randn(B, generator=g))
        ran = calls.call(zoo.Inputs(args, {}, zoo.Case("t", B, T), lambda o: o, None, zoo.VOCAB))
        # the head streams over the K completion tokens in chunks of 4; each layer over T in chunks of 5
        assert ran["chunks_backward"] == chunk_count(K, 4) + calls.layers * chunk_count(T, 5), (B, T, K, ran)
    # the per-row stack is a Python loop over the batch, so Dynamo keeps B static: the first
    # shape, then one graph with symbolic T and K per batch size (2 and 3)
    assert calls.compiles == 3


def _pair_inputs(name, B, T, g):
    """DPO (chosen and rejected concatenated into one batch: a batch axis of B0 + B1) or GRPO
    on ``logits[:, :-1]`` (the labels' own length symbol equated with T - 1 by a gather)."""
    ids = torch.randint(1, zoo.VOCAB, (2 * B, T), generator=g)
    labels = ids.clone()
    labels[:, :3] = -100
    if name == "dpo":
        args = (ids[:B], labels[:B], ids[B:], labels[B:], torch.randn(B, generator=g), torch.randn(B, generator=g))
    else:
        args = (ids, labels, torch.randn(2 * B, T - 1, generator=g) * 0.3 - 4, torch.randn(2 * B, generator=g))
    return zoo.Inputs(args, {}, zoo.Case("t", B, T), lambda o: o, None, zoo.VOCAB)


def _pair_loss(name):
    from test_head_streaming import DPOLoss, GRPOLoss

    def factory():
        lm, _ = zoo.tiny_llama()
        return (DPOLoss(lm) if name == "dpo" else GRPOLoss(lm, shift="logits")), None
    return factory


@pytest.mark.parametrize("name", ["dpo", "grpo_logit_shift"])
def test_preference_and_rl_losses_every_length(name):
    """Sizes that are sums or unproven equalities of Dynamo's symbols: DPO's batch of chosen +
    rejected is read whole from the chunk's inputs; GRPO's labels carry a length symbol of their
    own, made one axis with the logits' T - 1 by the gather. Both stream at every length."""
    calls = Calls(_pair_loss(name))
    g = torch.Generator().manual_seed(3)
    for B, T in [(2, 16), (3, 19), (2, 13), (3, 24), (2, 7)]:
        calls.call(_pair_inputs(name, B, T, g))
    assert calls.compiles == 2


def test_labels_shorter_than_the_logits_run_exactly(monkeypatch):
    """The gather in GRPO's loss lets its index (the labels) be shorter than the logits; the
    streamed head takes both to have the sequence's length (Dynamo's graph guards that their
    sizes agree). A call where they differ gets a graph of its own: exact, with a warning."""
    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    calls = Calls(_pair_loss("grpo_logit_shift"))
    g = torch.Generator().manual_seed(3)
    for B, T in [(2, 16), (3, 19)]:
        calls.call(_pair_inputs("grpo_logit_shift", B, T, g))
    ids = torch.randint(1, zoo.VOCAB, (4, 21), generator=g)
    labels = ids[:, :15].clone()  # 14 labelled positions against 20 logits rows
    args = (ids, labels, torch.randn(4, 14, generator=g) * 0.3 - 4, torch.randn(4, generator=g))
    calls.model.zero_grad(set_to_none=True)
    calls.ref.zero_grad(set_to_none=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = calls.compiled(*args)
        loss.backward()
    ref = calls.ref(*args)
    ref.backward()
    torch.testing.assert_close(loss.detach(), ref.detach(), rtol=1e-5, atol=1e-6)
    assert [w for w in caught if "streamfx" in str(w.message) and "not streamed" in str(w.message)], \
        [str(w.message) for w in caught]
    assert_grads_match({n: p.grad for n, p in calls.ref.named_parameters()},
                       {n: p.grad for n, p in calls.model.named_parameters()})
    assert calls.compiles == 3


class _SumsBySampleSize:
    """An Inductor post-grad pass that compiles code valid only at some sizes, as Inductor's own
    size-dependent choices are (a persistent reduction's block, a kernel's launch grid, a long
    sum's accumulation): a sum over a chunk-size dim of at most 64 rows sums rows [0, 64) alone
    (masking the rest), which is every row there and too few above. Deciding it records the
    guard ``rows <= 64`` (or ``> 64``) in the compile's shape environment."""

    def __call__(self, graph):
        aten = torch.ops.aten
        for n in list(graph.nodes):
            if n.target is not aten.sum.dim_IntList:
                continue
            x, dims = n.args[0], n.args[1]
            val = x.meta.get("val")
            for d in dims:
                size = val.shape[d]
                if not isinstance(size, torch.SymInt):
                    continue
                env = size.node.shape_env
                names = {s.name if isinstance(s.name, str) else s.name()
                         for sym in size.node.expr.free_symbols for s in env.var_to_sources.get(sym, [])}
                if not any(name.startswith("streamfx_") for name in names):
                    continue
                if size <= 64:
                    shape = [1] * val.dim()
                    shape[d] = -1

                    def add(op, args, value):
                        node = graph.call_function(op, args)
                        node.meta["val"] = value
                        return node

                    with graph.inserting_before(n), val.fake_mode:
                        rows = add(aten.sym_size.int, (x, d), size)
                        iota = dict(start=0, step=1, dtype=torch.int64, device=val.device, requires_grad=False)
                        idx_val = torch.ops.prims.iota.default(size, **iota)
                        idx = add(torch.ops.prims.iota.default, (rows,), idx_val)
                        idx.kwargs = iota
                        keep_val = aten.lt.Scalar(idx_val, 64).to(val.dtype).view(shape)
                        keep = add(aten.lt.Scalar, (idx, 64), aten.lt.Scalar(idx_val, 64))
                        keep = add(torch.ops.prims.convert_element_type.default, (keep, val.dtype), keep_val.view(-1))
                        keep = add(aten.view.default, (keep, shape), keep_val)
                        masked = add(aten.mul.Tensor, (x, keep), val * keep_val)
                    n.replace_input_with(x, masked)
                break

    def uuid(self):
        return "streamfx-tests-sums-by-sample-size-2"


def test_code_compiled_under_a_shape_guard_runs_only_where_it_holds():
    """A chunk graph's compile may decide code by the sample sizes its symbols are compiled at,
    recording each decision as a shape guard: a call whose sizes break a guard runs code
    compiled again at its own sizes (counted in ``guard_recompiles``), never the code the guard
    was taken for. Chunks of 40 rows compile at 40 (the guard rows <= 64); chunks of 100 rows
    break it in every graph that sums over rows."""
    from torch._inductor import config as inductor_config
    from streamfx import runtime

    runtime.clear_caches()
    calls = Calls("qwen3_sdpa", codegen="inductor", chunk_size=40, head_chunk_size=40)
    with inductor_config.patch(post_grad_custom_post_pass=_SumsBySampleSize()):
        first = calls.call(hf_inputs(calls, 1, 80))
        assert first["chunk_compiles"] > 0 and first["guard_recompiles"] == 0, first
        calls = Calls("qwen3_sdpa", codegen="inductor", chunk_size=100, head_chunk_size=100)
        second = calls.call(hf_inputs(calls, 1, 200))
        assert second["chunk_compiles"] == 0 and second["guard_recompiles"] > 0, second


def test_explain_says_a_refusal_that_holds_at_every_length_once():
    """A refusal found at the first length and again at a later one (its recompile) is warned
    once; each report lists it."""
    model, make_inputs = zoo.nanogpt()
    model.transformer.ln_f.register_forward_hook(lambda module, args, out: out.cumsum(1))
    inputs = make_inputs("prompt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = streamfx.explain(model, *inputs.args, options={"codegen": "eager"})
        later = report.later_lengths
    said = [str(w.message) for w in caught if str(w.message).startswith("streamfx")]
    assert len(said) == 1 and "cumsum" in said[0], said
    assert report.not_streamed and later.not_streamed, (report.not_streamed, later.not_streamed)
    assert all(isinstance(n, torch.SymInt) for n in later.seq_dim), later.seq_dim
