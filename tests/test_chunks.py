"""Chunk graphs are keyed on their structure: the layers of a model share their checks and
compiles, and graphs that differ in any op, connection or constant never share."""
import pytest
import torch
import torch.fx as fx

from conftest import assert_grads_match, grads_of, relative_error
from streamfx import chunks, runtime
from test_analysis import TinyLM

pytestmark = pytest.mark.fast  # the whole module is in the fast tier


def traced(f):
    return fx.symbolic_trace(f)


def test_structure_key_ignores_names_and_keeps_constants_apart():
    def a(x, y):
        return torch.relu(x * 2 + y)

    def b(u, v):
        w = u * 2
        return torch.relu(w + v)

    assert chunks.structure_key(traced(a)) == chunks.structure_key(traced(b))
    keys = {chunks.structure_key(traced(f)) for f in (
        lambda x, y: x * 2 + y, lambda x, y: x * 2.0 + y, lambda x, y: x * True + y,   # 2, 2.0, True
        lambda x, y: y * 2 + x,                                                       # other wiring
        lambda x, y: x * 2 - y, lambda x, y: x * -0.0 + y, lambda x, y: x * 0.0 + y)}
    assert len(keys) == 7


def _train(layers: int, codegen: str):
    torch.manual_seed(0)
    model = TinyLM(V=32, d=16, H=2, layers=layers)
    ref = TinyLM(V=32, d=16, H=2, layers=layers)
    ref.load_state_dict(model.state_dict())
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    compiled = torch.compile(model, backend="streambp",
                             options={"codegen": codegen, "chunk_size": 5, "head_chunk_size": 5})
    compiled(idx, idx).backward()
    ref(idx, idx).backward()
    assert_grads_match(grads_of(ref), grads_of(model))


@pytest.mark.parametrize("codegen", ["eager", pytest.param("inductor", marks=pytest.mark.heavy)])
def test_layers_share_their_chunk_graphs(codegen):
    """One layer or three: as many chunk graphs checked (and under Inductor compiled), since the
    layers' chunk graphs differ only in their node names; gradients stay exact."""
    counts = []
    for layers in (1, 3):
        torch._dynamo.reset()
        runtime.clear_caches()
        compiles = runtime.COUNTERS["chunk_compiles"]
        _train(layers, codegen)
        counts.append((len(chunks._CHECKED), runtime.COUNTERS["chunk_compiles"] - compiles))
    assert counts[0] == counts[1] and counts[0][0] > 0, counts
    assert (counts[0][1] > 0) == (codegen == "inductor"), counts


@pytest.mark.heavy   # (two Inductor compiles of the chunk graphs)
def test_a_chunk_graph_compiled_before_loads_from_the_caches(tmp_path, monkeypatch):
    """A chunk graph compiled once (by this process or an earlier one: the caches are on disk)
    is not traced again: its second compile is a hit of AOTAutograd's cache, with exact
    gradients."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    hits = []
    for _ in range(2):
        torch._dynamo.reset()
        runtime.clear_caches()
        before = counters["aot_autograd"]["autograd_cache_hit"]
        _train(1, "inductor")
        hits.append(counters["aot_autograd"]["autograd_cache_hit"] - before)
    assert hits[0] == 0 and hits[1] > 0, hits


def test_inputs_sharing_a_symbolic_axis_must_agree_at_run_time():
    """Two inputs whose dims are one axis of one symbolic size (an equality the analysis assumed
    where Dynamo had not proven it) are read through one size: a call where they differ raises,
    and the region runs whole or strict raises (``failures.settle``), instead of computing on wrong rows."""
    import sympy

    s = sympy.Symbol("s7", positive=True, integer=True)
    slot = chunks.Slot((s, 3), torch.float32, "cpu")
    graph = chunks.ChunkGraph("t", traced(lambda a, b: a[:, :1] + b[:, :1]), (slot, slot))
    run = graph.fn("eager", train=False)
    torch.testing.assert_close(run(torch.ones(4, 3), torch.ones(4, 3)), torch.full((4, 1), 2.0))
    with pytest.raises(RuntimeError, match="share an axis differ in size"):
        run(torch.ones(4, 3), torch.ones(2, 3))


@pytest.mark.parametrize("train", [False, True])
def test_a_symbol_only_merged_into_dims_is_solved_and_bound_for_inductor(train):
    """A shape symbol that is no input's whole dim, only a factor of one (a dynamic batch merged
    with the heads, ``[B x H, q, d]`` as ``nn.MultiheadAttention`` lays it out), is solved from
    that dim and passed as a size input, so Inductor's code binds it; one compile serves every
    batch size, and its gradients and the joint vjp match autograd's."""
    import sympy

    s = sympy.Symbol("s7", positive=True, integer=True)
    slot = chunks.Slot((4 * s, "q", 8), torch.float32, "cpu")
    graph = chunks.ChunkGraph("t", traced(lambda x, w: ((x * w).sin() * x).cumsum(1)),
                              (slot, chunks.Slot((8,), torch.float32, "cpu")))
    assert graph.sizes[-1] == s and graph.values((torch.ones(12, 5, 8), torch.ones(8)))[s] == 3
    before = dict(chunks.COUNTERS)
    run = graph.fn("inductor", train=train, grads=(0, 1))
    w = torch.randn(8)
    for B, q in [(2, 5), (3, 7), (1, 4)]:
        x = torch.randn(4 * B, q, 8)
        xs = [x.clone().requires_grad_(train), w.clone().requires_grad_(train)]
        with torch.enable_grad() if train else torch.no_grad():
            out = run(*xs)
        out = out[0] if isinstance(out, (list, tuple)) else out
        ref_xs = [x.clone().requires_grad_(), w.clone().requires_grad_()]
        ref = ((ref_xs[0] * ref_xs[1]).sin() * ref_xs[0]).cumsum(1)
        torch.testing.assert_close(out, ref)
        if train:
            g = torch.randn_like(ref)
            expected = list(torch.autograd.grad(ref, ref_xs, g))
            torch.testing.assert_close(list(torch.autograd.grad(out, xs, g)), expected)
            got, _ = graph.vjp("inductor", (0, 1))(xs, [g])
            torch.testing.assert_close(got, expected)
    assert chunks.COUNTERS["chunk_compile_failures"] == before["chunk_compile_failures"]
    assert chunks.COUNTERS["vjp_fallbacks"] == before["vjp_fallbacks"]
    assert chunks.COUNTERS["guard_recompiles"] == before["guard_recompiles"]


def test_key_range_cache_is_keyed_on_identity_version_and_value(monkeypatch):
    """The key-range cache (``keyranges.RangeCache``): a large mask input hits only while it is
    the same live tensor, unchanged (an in-place edit bumps its version: a miss); a small
    per-token input hits when equal in value, and misses when any value differs."""
    from streamfx import keyranges

    monkeypatch.setattr(keyranges, "SMALL", 4)   # inputs above 4 elements count as large
    cache = keyranges.RangeCache()
    big, small = torch.zeros(2, 8), torch.tensor([1, 2, 3])
    cache.put([big, small], ("x",), "result")
    assert cache.get([big, small.clone()], ("x",)) == "result"        # same tensor, equal values
    assert cache.get([big, small], ("y",)) is None                    # other extra key
    assert cache.get([big, torch.tensor([1, 2, 4])], ("x",)) is None  # a small input changed
    assert cache.get([big.clone(), small], ("x",)) is None            # an equal copy of a large one
    big.add_(1)                                                       # edited in place
    assert cache.get([big, small], ("x",)) is None


@pytest.mark.fast
def test_key_range_cache_reads_new_equal_inputs_once_then_matches_them_by_identity(monkeypatch):
    """A new step hands every layer the same new position tensors, equal to the last step's. On a
    GPU each value comparison waits for the device, so the first call compares all of them at
    once (one comparison call, every input in it), and the entry then names the new tensors: the
    step's other calls match by identity without comparing. A value that differs still misses,
    and an in-place edit of a tensor the entry names is compared by value again."""
    from streamfx import keyranges

    compared = []
    real = keyranges._values_equal
    monkeypatch.setattr(keyranges, "_values_equal",
                        lambda groups: compared.append(sum(map(len, groups))) or real(groups))
    cache = keyranges.RangeCache()
    old = [torch.arange(6).view(1, 6), torch.arange(6).view(6, 1), torch.tensor(-1e9)]
    cache.put(old, ("T",), "ranges")
    new = [t.clone() for t in old]
    for _ in range(5):   # (the step's layers, forward and backward)
        assert cache.get(new, ("T",)) == "ranges"
    assert compared == [3]
    new[0].add_(0)       # (a new version: compared again, still equal)
    assert cache.get(new, ("T",)) == "ranges" and compared == [3, 1]
    other = [new[0], new[1], torch.tensor(-2e9)]
    assert cache.get(other, ("T",)) is None and compared == [3, 1, 1]
    assert cache.get(new, ("T",)) == "ranges" and compared == [3, 1, 1]   # (still named by the entry)
    # a layer's mask inputs are often views (or detached aliases) made anew in every layer of one
    # tensor that lives through the step: a new Python object with the named memory, layout and
    # version matches by identity too, while that memory lives
    base = new[0].view(-1)
    for _ in range(3):
        assert cache.get([base.view(1, 6), new[1].detach(), new[2]], ("T",)) == "ranges"
    assert compared == [3, 1, 1]
    fresh = [torch.arange(6).view(1, 6), torch.arange(6).view(6, 1), torch.tensor(-1e9)]
    assert cache.get(fresh, ("T",)) == "ranges" and compared == [3, 1, 1, 3]   # (other memory: compared)


@pytest.mark.fast
def test_key_range_cache_compares_every_entry_in_one_read(monkeypatch):
    """Entries left by earlier steps (other paddings, other models of one structure in the same
    process) are compared in one read together, however many there are: a value no entry holds
    costs one read, and one equal to an older entry's is found with one read and returns that
    entry's result, not a newer one's."""
    from streamfx import keyranges

    reads = []
    real = keyranges._values_equal
    monkeypatch.setattr(keyranges, "_values_equal", lambda groups: reads.append(len(groups)) or real(groups))
    cache = keyranges.RangeCache()
    for v in range(4):
        cache.put([torch.full((1, 6), v)], ("T",), f"ranges {v}")
    assert cache.get([torch.full((1, 6), 9)], ("T",)) is None and reads == [4]
    assert cache.get([torch.full((1, 6), 1)], ("T",)) == "ranges 1" and reads == [4, 4]
    assert cache.get([torch.full((1, 6), 2)], ("T",)) == "ranges 2" and reads == [4, 4, 4]
    named = torch.full((1, 6), 0)
    assert cache.get([named], ("T",)) == "ranges 0" and reads == [4, 4, 4, 4]
    assert cache.get([named], ("T",)) == "ranges 0" and reads == [4, 4, 4, 4]   # (named: no read)


@pytest.mark.heavy   # (the key-range cache alone: test_key_range_cache_compares_every_entry_in_one_read)
def test_a_step_reads_its_mask_inputs_from_the_device_once(monkeypatch):
    """A padded batch through a 4-layer Hugging Face model: each layer's mask inputs are views made
    anew of the step's position tensors. After the first step (which evaluates the masks), a step
    with new tokens under the same padding compares its new position tensors with the last step's
    once, and every other layer, forward and backward, matches them by identity: on a GPU each
    comparison waits for the device. Padding that differs is compared once, found unequal and
    evaluated again. Every step's gradients equal eager's."""
    import copy

    import zoo
    from streamfx import keyranges

    monkeypatch.setattr(zoo, "LAYERS", 4)
    model, make_inputs = zoo.qwen3()
    ref = copy.deepcopy(model)
    # (both rows padded, so that the keys a chunk reads differ: 9 padded positions, then 2)
    mask = torch.ones_like(make_inputs("left_pad").kwargs["attention_mask"])
    other = mask.clone()
    mask[:, :9] = 0
    other[:, :2] = 0
    compiled = torch.compile(model, backend="streambp", options={"chunk_size": 5})
    # (key ranges are cached per mask graph structure, process-wide: an earlier test's model of this
    # structure would have left entries for these paddings)
    monkeypatch.setattr(runtime, "_RANGE_CACHES", {})
    compared = []
    real = keyranges._values_equal
    monkeypatch.setattr(keyranges, "_values_equal",
                        lambda groups: compared.append(sum(map(len, groups))) or real(groups))
    torch.manual_seed(0)
    for step, m in enumerate([mask, mask, mask, other]):
        ids = torch.randint(0, zoo.VOCAB, m.shape)
        batch = {"input_ids": ids, "attention_mask": m, "labels": ids.masked_fill(m == 0, -100)}
        compared.clear()
        checks = runtime.COUNTERS["mask_checks"]
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        compiled(**batch).loss.backward()
        ref(**batch).loss.backward()
        assert_grads_match(grads_of(ref), grads_of(model))
        if step in (1, 2):
            assert len(compared) == 1 and runtime.COUNTERS["mask_checks"] == checks, (step, compared)
        if step == 3:
            assert len(compared) == 1 and runtime.COUNTERS["mask_checks"] == checks + 1, (step, compared)


def test_a_16_bit_gradient_is_summed_in_fp32_only_once_a_second_chunk_adds_to_it():
    """A whole input's (a weight's) gradient over a region's chunks: one contribution is returned
    as it is (no fp32 copy of the weight); a second promotes the sum to fp32, as exact as before."""
    g1 = torch.randn(8, 4).to(torch.bfloat16)
    g2 = torch.randn(8, 4).to(torch.bfloat16)
    one = runtime._sum_into(None, g1, late=True)
    assert one is g1
    given = runtime._sum_into(None, g1, given=[g1], late=True)    # (autograd handed back an output gradient)
    assert given is not g1 and given.dtype == torch.bfloat16 and torch.equal(given, g1)
    two = runtime._sum_into(runtime._sum_into(None, g1, late=True), g2, late=True)
    assert two.dtype == torch.float32
    assert torch.equal(two, g1.float() + g2.float())
    assert runtime._sum_into(None, g1).dtype == torch.float32   # (a sum whose buffer must be fp32 from the start)


@pytest.mark.fast
def test_a_transposed_weight_gradient_is_summed_in_its_own_layout():
    """Autograd gives a weight used transposed (an LM head's ``x @ W.t()``) its gradient in the
    weight's layout. The first chunk's is the sum's buffer as it is (no copy), later ones add to
    it in memory order; a view of part of a storage, or one sharing the storage of an output
    gradient autograd was given, is copied."""
    Wt = torch.randn(32, 8).t().requires_grad_()   # (a [8, 32] view of a [32, 8] weight)
    got = [torch.autograd.grad((torch.randn(5, 8, generator=torch.Generator().manual_seed(s)) @ Wt).square().sum(),
                               Wt)[0] for s in (0, 1)]
    assert not got[0].is_contiguous() and got[0].stride() == Wt.stride(), got[0].stride()
    first = runtime._sum_into(None, got[0])
    assert first is got[0]
    total = runtime._sum_into(first, got[1])
    assert total is first and total.stride() == Wt.stride()
    # returned in the layout asked for (the input's, as the region ops' fake outputs are): as it
    # is where it has it, else laid out and cast in one copy (a square one too)
    square = torch.randn(8, 8).t()
    assert runtime.in_order(total, (1, 0), torch.float32) is total
    for t, dtype in ((total, torch.float32), (total, torch.bfloat16), (square, torch.float32), (square, torch.bfloat16)):
        for order in (None, (1, 0)):
            out = runtime.in_order(t, order, dtype)
            assert out.dtype == dtype and torch.equal(out, t.to(dtype))
            assert out.is_contiguous() if order is None else out.t().is_contiguous(), (order, out.stride())
    plain = torch.randn(8, 8)
    assert runtime.in_order(plain, None, torch.float32) is plain
    part = torch.randn(8, 64)[:, :32]   # (a view of part of a storage)
    assert runtime._sum_into(None, part) is not part
    assert runtime._sum_into(None, got[1], given=[got[1].t()]) is not got[1]


@pytest.mark.fast
@pytest.mark.parametrize("second", ["transposed", "same"])
def test_gradients_of_one_call_sharing_a_storage_are_summed_apart(second):
    """One autograd call may hand one gradient to two whole inputs (``a + b.t()``: the same
    tensor, transposed; or the same tensor twice): the sums over chunks are kept apart, each
    the sum of its own gradients."""
    import types

    from streamfx.passes.specs import WHOLE

    prog = types.SimpleNamespace(grad_inputs=[0, 1], in_specs=[WHOLE, WHOLE])
    acc = {0: None, 1: None}
    parts = [torch.randn(6, 6, generator=torch.Generator().manual_seed(s)) for s in (0, 1, 2)]
    for G in parts:
        G = G * 1.0   # (a tensor of its own, as autograd's)
        got = [G, G.t() if second == "transposed" else G]
        runtime.RegionProgram._accumulate(prog, acc, got, 0, 6)
    total = sum(parts)
    assert torch.allclose(acc[0], total) and acc[0].data_ptr() != acc[1].data_ptr()
    assert torch.allclose(acc[1], total.t() if second == "transposed" else total)


@pytest.mark.heavy
def test_a_chunks_weight_gradients_are_freed_before_the_next_chunk_runs(monkeypatch):
    """While a chunk runs, the last chunk's gradients are gone, but for what the sums over the
    chunks keep (a chunk's weight gradients are weight-sized: kept into the next chunk, the LM
    head of a large vocabulary is held twice over). The layers' and the head's backward loops
    free them the same way."""
    import weakref

    import zoo

    model, _ = zoo.qwen3("sdpa")
    earlier, kept, stale = [], [], []
    store, original = runtime.RegionProgram._store, runtime.RegionProgram.fn

    def _store(self, stored, got, inputs, s, e):
        store(self, stored, got, inputs, s, e)
        earlier.extend(weakref.ref(g) for g in got if g is not None)
        kept[:] = [x for x in stored if x is not None]

    def fn(self, *a, **k):
        f = original(self, *a, **k)

        def checked(*xs):
            if self.seeds is not None:   # (the head: its forward runs each chunk's backward)
                alive = [r() for r in earlier if r() is not None]
                stale.append(sum(1 for t in alive if not any(t is x for x in kept)))
            return f(*xs)
        return checked

    monkeypatch.setattr(runtime.RegionProgram, "_store", _store)
    monkeypatch.setattr(runtime.RegionProgram, "fn", fn)
    compiled = torch.compile(model, backend="streambp", options={"codegen": "eager", "head_chunk_size": 16})
    ids = torch.randint(1, zoo.VOCAB, (1, 64), generator=torch.Generator().manual_seed(0))
    compiled(input_ids=ids, labels=ids).loss.backward()
    assert len(stale) == 4, stale
    assert stale == [0, 0, 0, 0], stale   # (no earlier chunk's gradient alive but the sums)


@pytest.mark.parametrize("codegen,dtype,head_grad", [
    ("eager", torch.float32, "forward"), ("eager", torch.bfloat16, "recompute"), ("eager", torch.bfloat16, "forward"),
    pytest.param("inductor", torch.bfloat16, "forward", marks=pytest.mark.heavy)])
def test_parameter_gradients_reach_autograd_in_the_parameters_layout(codegen, dtype, head_grad):
    """A linear layer's weight is read transposed (``permute`` in the graph, outside the region);
    the region returns its gradient in that input's layout, so the graph's view back to the
    weight has the weight's own layout and autograd's AccumulateGrad keeps the tensor as it is:
    the gradient a parameter hook sees is the parameter's ``.grad`` (a row-major one would be
    copied twice a step, here and by AccumulateGrad). Gradients stay exact (bf16: against the fp32
    model, within twice eager bf16's own error + 1e-2, as ``test_bf16_against_fp32_reference``);
    under Inductor the compiled graph's stride checks see the layout the ops' fake values say."""
    torch.manual_seed(0)
    fp32 = TinyLM(V=32, d=16, H=2, layers=2)
    model = TinyLM(V=32, d=16, H=2, layers=2)
    model.load_state_dict(fp32.state_dict())
    model = model.to(dtype)
    ref = TinyLM(V=32, d=16, H=2, layers=2).to(dtype)
    ref.load_state_dict(model.state_dict())
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    seen = {}
    for name, p in model.named_parameters():
        p.register_hook(lambda g, name=name: seen.__setitem__(name, g.data_ptr()))
    compiled = torch.compile(model, backend="streambp", options={
        "codegen": codegen, "chunk_size": 5, "head_chunk_size": 5, "head_grad": head_grad, "strict": True})
    compiled(idx, idx).backward()
    ref(idx, idx).backward()
    if dtype == torch.float32:
        assert_grads_match(grads_of(ref), grads_of(model))
    else:
        fp32(idx, idx).backward()
        for (name, got), (_, base), (_, exact) in zip(grads_of(model).items(), grads_of(ref).items(),
                                                      grads_of(fp32).items()):
            err, own = relative_error(got.float(), exact), relative_error(base.float(), exact)
            assert err <= 2 * own + 1e-2, (name, err, own)
    weights = {n: p for n, p in model.named_parameters() if p.dim() == 2 and n != "emb.weight"}
    assert set(weights) == {"qkv.0.weight", "qkv.1.weight", "mlp.0.weight", "mlp.1.weight", "head.weight"}
    for name, p in weights.items():
        assert p.grad.is_contiguous() and p.grad.dtype == dtype, name
        assert seen[name] == p.grad.data_ptr(), f"{name}: AccumulateGrad copied the region's gradient"


class _Graph:
    """What ``Sized`` reads of a chunk graph: its name and a call's sizes."""
    name = "stub"

    @staticmethod
    def values(args):
        return {"q": args[0], "k": args[1]}


def test_sized_runs_each_compile_only_where_its_shape_guards_hold():
    """A compile's guards decide where its code runs: sizes that break every compile's guards
    compile again at their own sizes (counted), the choice is remembered per sizes, a compile
    that raises leaves those sizes and later ones to ``failed``'s code, a device error raised
    while compiling reaches the caller."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Mod

    q, k = chunks.KEY_SYMBOLS["q"], chunks.KEY_SYMBOLS["k"]
    compiled = []

    def compile_at(values):
        compiled.append((values["q"], values["k"]))
        small = values["q"] <= 64
        guards = (sympy.Le(q, 64) if small else sympy.Gt(q, 64), sympy.Ge(k - q, 0))
        return chunks.Variant(("small" if small else "large", values["q"], values["k"]), guards)

    sized = chunks.Sized(_Graph(), compile_at, failed=lambda e: chunks.Variant("fx"))
    before = chunks.COUNTERS["guard_recompiles"]
    assert sized.pick((40, 50)) == ("small", 40, 50)
    assert sized.pick((10, 50)) == ("small", 40, 50)       # its guards hold: no compile
    assert sized.pick((100, 120)) == ("large", 100, 120)   # q <= 64 fails: compiled again
    assert sized.pick((100, 90)) == ("large", 100, 90)     # k >= q fails for both: again
    assert sized.pick((40, 50)) == ("small", 40, 50) and sized.pick((300, 300)) == ("large", 100, 120)
    assert compiled == [(40, 50), (100, 120), (100, 90)] and chunks.COUNTERS["guard_recompiles"] - before == 2

    def refuse(values):
        raise RuntimeError("no code at these sizes")

    sized = chunks.Sized(_Graph(), refuse, failed=lambda e: chunks.Variant(("fx", str(e))))
    assert sized.pick((5, 5)) == ("fx", "no code at these sizes") == sized.pick((500, 900))

    def device_error(values):
        raise torch.OutOfMemoryError("CUDA out of memory while benchmarking a kernel")

    with pytest.raises(torch.OutOfMemoryError):
        chunks.Sized(_Graph(), device_error, failed=lambda e: chunks.Variant("fx")).pick((5, 5))

    # guards in Inductor's integer functions evaluate at the sizes
    guards = (sympy.Le(FloorDiv(32 * q, 7), 100), sympy.Eq(Mod(k, 8), 0))
    assert chunks.holds(guards, {"q": 16, "k": 32}) and not chunks.holds(guards, {"q": 24, "k": 32})
    assert not chunks.holds(guards, {"q": 16, "k": 33})
