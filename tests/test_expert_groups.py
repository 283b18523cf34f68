"""Experts that count their tokens: rows sorted by expert, split into one group per expert by
the counts ``.tolist()`` reads, a matmul per group, the groups put back by ``cat`` (JetMoE's and
ScatterMoE's dispatch). Per chunk the chunk counts its own tokens and splits its own rows, so every
layer streams with exact gradients; a count read as a value is still a sum over the sequence."""
import pytest
import torch
from hypothesis import example, given, strategies as st

from conftest import assert_grads_match, run_eager_and_compiled
from streamfx.passes.axes import AxisTable
from streamfx.passes.seq_dims import SEQ_REDUCTION, TOKEN_LOCAL, UNKNOWN_MIXING, infer_axes

import zoo
from tiers import compiling
from streamfx.passes.schedule import chunk_count

T = 13


def _run(B, length, chunk, options=None, **model_kw):
    model, make_inputs = zoo.counted_moe(**model_kw)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        run = run_eager_and_compiled(model, make_inputs(zoo.Case("t", B, length)),
                                     {"chunk_size": chunk, "strict": True, **(options or {})})
    torch.testing.assert_close(run.loss, run.ref_loss, rtol=1e-5, atol=1e-6)
    assert_grads_match(run.ref_grads, run.grads)
    n = chunk_count(length, min(chunk, length))
    layers = {name: runs for name, runs in run.schedules.items() if name.startswith("layer.")}
    assert sorted(layers) == [f"layer.{i}" for i in range(zoo.LAYERS)], (run.schedules, run.warnings)
    assert all(runs and set(runs) == {n} for runs in layers.values()), layers
    assert not run.warnings, run.warnings
    return run


@pytest.mark.fast
@pytest.mark.parametrize("count", ["scatter", pytest.param("one_hot", marks=pytest.mark.heavy)])
def test_counted_groups_stream_every_layer(count):
    _run(2, T, 5, count=count)


def test_counted_groups_under_inductor():
    """Compiled by Inductor from scratch: no chunk graph checked or compiled before (so the graphs
    compiled are the ones whose shape check ran, propagating the unbacked sizes in its own shape
    environment), no FX graph or AOTAutograd cache entry to load from (so Inductor propagates
    them again, in its own)."""
    from torch._functorch import config as functorch_config
    from torch._inductor import config as inductor_config

    from streamfx import runtime

    runtime.clear_caches()
    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        run = _run(2, T, 5, {"codegen": "inductor"})
    assert run.counters["chunk_compiles"] > 0, run.counters


@compiling(2)
@example(B=1, length=16, top_k=1, experts=4, chunk=5)
@example(B=1, length=7, top_k=3, experts=3, chunk=3)
@given(B=st.integers(1, 3), length=st.integers(2, 20), top_k=st.integers(1, 3), experts=st.integers(2, 6),
       chunk=st.integers(1, 8))
def test_counted_groups_for_any_batch_length_and_routing(B, length, top_k, experts, chunk):
    """Random batch (1 included), length, experts per token (1 included), expert count and chunk
    size (chunks in which some expert gets no token): every layer streams under strict=True, and
    loss and gradients equal eager's."""
    torch._dynamo.reset()
    _run(B, length, chunk, experts=experts, top_k=min(top_k, experts))


# ---- the analysis ------------------------------------------------------------------------------
def _graph(fn, *shapes):
    """fn traced with symbolic shapes (``.tolist()`` as unbacked sizes), its input's dim 0 the
    sequence: {node name: class}."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, tracing_mode="symbolic")(*[torch.randn(s) for s in shapes])
    sd = infer_axes(gm.graph)
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    sd.set_seq(sd.axes[x][0][0][0])
    return {n.name: sd.classify(n) for n in gm.graph.nodes if n.op == "call_function"}


def _dispatch(x, w, by_other_ids=False, reorder=False, count_as_value=False):
    ids = x.topk(2, dim=1).indices
    counted = (ids + 1) % 4 if by_other_ids else ids
    counts = x.new_zeros(x.shape[0], 4).scatter(1, counted, 1).long().sum(0)
    _, order = ids.flatten().sort(0)
    rows = x[order.div(2, rounding_mode="floor")]
    groups = [group @ w[i] for i, group in enumerate(rows.split(counts.tolist(), dim=0))]
    out = torch.cat(groups[::-1] if reorder else groups, dim=0)
    if count_as_value:
        out = out * counts[0]
    return torch.zeros_like(x).index_add(0, order.div(2, rounding_mode="floor"), out)


@pytest.mark.fast
def test_the_dispatch_is_token_local():
    classes = _graph(lambda x, w: _dispatch(x, w), (8, 4), (4, 4, 4))
    assert UNKNOWN_MIXING not in classes.values() and SEQ_REDUCTION not in classes.values(), classes
    assert classes["index_add"] == TOKEN_LOCAL and classes["cat"] == TOKEN_LOCAL, classes


@pytest.mark.fast
@pytest.mark.parametrize("case", ["by_other_ids", "reorder"])
def test_groups_that_are_not_the_sorted_rows_mix(case):
    """Sizes counted from other ids than those sorted, or the groups put back in another order:
    a row lands with another token's."""
    classes = _graph(lambda x, w: _dispatch(x, w, **{case: True}), (8, 4), (4, 4, 4))
    assert classes[{"by_other_ids": "split_with_sizes", "reorder": "cat"}[case]] == UNKNOWN_MIXING, classes


@pytest.mark.fast
def test_a_count_read_as_a_value_is_a_sum_over_the_sequence():
    classes = _graph(lambda x, w: _dispatch(x, w, count_as_value=True), (8, 4), (4, 4, 4))
    assert classes["sum_1"] == SEQ_REDUCTION, classes


@pytest.mark.fast
def test_a_view_splits_a_leading_factor_off_again():
    """[slot, heads x dim] viewed as [slot x heads, dim] and back to [slot, rest]: the slot dim
    is the slot axis again (JetMoE's attention experts); a split of another size is not."""
    t = AxisTable()
    slot, hidden = t.fresh(2), t.fresh(32)
    merged = t.regroup((slot, hidden), (2, 32), (4, 16))
    assert merged[0] != slot
    back = t.regroup((merged[0], t.fresh(16)), (4, 16), (2, 32))
    assert t.canon(back[0]) == t.canon(slot)
    other = t.regroup((merged[0], t.fresh(16)), (4, 16), (4, 16, 1)[:1] + (16,))
    assert t.canon(other[0]) == t.canon(merged[0])
    assert t.canon(t.regroup((merged[0], t.fresh(16)), (4, 16), (8, 8))[0]) != t.canon(slot)


@pytest.mark.fast
def test_rows_added_into_a_table_of_other_rows_are_not_the_tokens():
    """``zeros(max_positions, C).index_put_([arange(T)], g, accumulate=True)``: a learned position
    embedding's gradient as torch 2.11 decomposes ``embedding_dense_backward``. Indexed by the
    tokens' positions, but its rows are the table's: the table's 64 rows are not the sequence
    axis (the sequence kept its symbolic size; unified, a later call's T read as 64)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def grad_of_positions(g):
        pos = torch.arange(g.shape[0])
        return torch.zeros(64, g.shape[1]).index_put((pos,), g, accumulate=True)

    gm = make_fx(grad_of_positions, tracing_mode="symbolic")(torch.randn(12, 4))
    sd = infer_axes(gm.graph)
    g = next(n for n in gm.graph.nodes if n.op == "placeholder")
    seq = sd.axes[g][0][0]
    table = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.index_put.default)
    assert sd.table.canon(sd.axes[table][0][0]) != sd.table.canon(seq)
    assert not isinstance(sd.table.size[sd.table.find(seq[0])], int), sd.table.size[sd.table.find(seq[0])]
