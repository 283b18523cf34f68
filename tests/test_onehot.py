"""A loss's one-hot gradient made pointwise in the chunk graphs Inductor compiles (``streamfx.onehot``):
the same bits as the scatter, no logits-sized buffer or scatter in the compiled backward, and
only the one-hot form rewritten."""
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from streamfx import onehot

aten = torch.ops.aten


def _picked_loss(x, w, labels):
    """A language-model head's loss as Hugging Face writes it: log-softmax, each row's target picked."""
    logp = torch.log_softmax(x @ w, -1)
    return -logp.gather(1, labels[:, None]).sum()


def _inputs(rows=64, d=32, vocab=1000):
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, d, generator=g), torch.randn(d, vocab, generator=g) * 0.1, \
        torch.randint(0, vocab, (rows,), generator=g)


def _gradient_graph(f, args, wrt):
    def step(*a):
        a = [x.detach().requires_grad_(i in wrt) for i, x in enumerate(a)]
        return torch.autograd.grad(f(*a), [a[i] for i in wrt])

    from torch._inductor.decomposition import select_decomp_table

    return make_fx(step, decomposition_table=select_decomp_table(), tracing_mode="fake")(*args)


@pytest.mark.fast
def test_the_one_hot_gradient_and_its_row_sum_become_pointwise():
    traced = _gradient_graph(_picked_loss, _inputs(), (0, 1))
    targets = [n.target for n in traced.graph.nodes]
    assert aten.scatter_add.default in targets
    assert onehot.rewrite(traced.graph) == 1
    traced.graph.lint()
    targets = [n.target for n in traced.graph.nodes]
    assert aten.scatter_add.default not in targets and aten.where.self in targets
    # (the row sum of the one-hot is the picked values: no sum reads the where)
    where = next(n for n in traced.graph.nodes if n.target is aten.where.self)
    assert all(u.target is not aten.sum.dim_IntList for u in where.users)


@pytest.mark.fast
def test_only_the_one_hot_form_is_rewritten():
    """Two indices per row, an index narrower than the zeros, zeros read elsewhere: left as they are."""
    def two_per_row(x, idx):
        return torch.zeros_like(x).scatter_add(1, idx, x.gather(1, idx))

    def narrower(x, idx):
        return torch.zeros_like(x).scatter_add(1, idx[:4, :1], x[:4, :1])

    def zeros_read_twice(x, idx):
        z = torch.zeros_like(x)
        return z.scatter_add(1, idx[:, :1], x[:, :1]) + z

    x, idx = torch.randn(8, 16), torch.randint(0, 16, (8, 2))
    for f in (two_per_row, narrower, zeros_read_twice):
        traced = make_fx(f)(x, idx)
        assert onehot.rewrite(traced.graph) == 0, f.__name__


@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_with_the_pass_the_same_bits_and_no_scatter(threads):
    """Inductor's code for the loss's backward with the pass (as a chunk compile runs it): loss and
    gradients equal to the code without it, bit for bit, and no scatter nor logits-sized buffer
    made for the one-hot gradient. Inductor lowers a CPU scatter_add by thread count: with more
    than one thread a call of aten's scatter (atomic adds are slow), with one a loop of its own
    fused into the kernels; both are compiled here (config.cpp.threads), whatever the machine."""
    from torch._inductor import config
    from torch._inductor.utils import run_and_get_code

    x, w, labels = _inputs(rows=48, vocab=3000)

    def compiled(joint_pass):
        torch._dynamo.reset()
        # (every cache off: the code of both graphs is compiled here, whatever ran before)
        with config.patch(joint_custom_post_pass=joint_pass, force_disable_caches=True,
                          **{"cpp.threads": threads}):
            f = torch.compile(_picked_loss, backend="inductor", dynamic=False)

            def run():
                a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
                loss = f(a, b, labels)
                return (loss.detach(), *torch.autograd.grad(loss, (a, b)))

            return run_and_get_code(run)

    plain, plain_code = compiled(None)
    mine, code = compiled(onehot.ONE_HOT_PASS)
    for a, b in zip(plain, mine):
        assert torch.equal(a, b)
    logits_sized = "(48, 3000), (3000, 1)"
    # (kernel names keep the source op's name: the call of a scatter is what is looked for)
    assert ("aten.scatter" in "".join(plain_code)) == (threads > 1)
    assert "aten.scatter" not in "".join(code)
    assert "".join(code).count(logits_sized) < "".join(plain_code).count(logits_sized)


@pytest.mark.fast
@pytest.mark.parametrize("scale, summed_away", [(-2.0, True), (float("inf"), False)], ids=["finite", "inf"])
def test_a_row_sum_through_ops_that_keep_zeros_is_the_picked_values(scale, summed_away):
    """A sum of the one-hot along its dim, directly or through ops that keep zeros zero (a negation,
    a product with a finite number), becomes those ops applied to the picked values; through a
    product with inf (0 * inf is nan) the sum stays. Either way the graph computes the same bits."""
    def f(src, idx):
        z = torch.zeros(src.shape[0], 16).scatter_add(1, idx, src)
        return (-(z * scale)).sum(1, keepdim=True), (z / 4).sum(1), z + 1

    g = torch.Generator().manual_seed(0)
    src, idx = torch.randn(8, 1, generator=g), torch.randint(0, 16, (8, 1), generator=g)
    traced = make_fx(f)(src, idx)
    want = traced(src, idx)
    assert onehot.rewrite(traced.graph) == 1
    traced.graph.lint()
    traced.recompile()
    sums = [n for n in traced.graph.nodes if n.target is aten.sum.dim_IntList]
    assert len(sums) == (0 if summed_away else 1)
    for a, b in zip(want, traced(src, idx)):
        torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)   # (0 * inf: nan in both)


@pytest.mark.fast
def test_the_memory_model_sizes_what_chunk_compiles_run_now(monkeypatch):
    """Inductor's code has the rewrite where chunk compiles run the pass at that time: a curve
    sized with it is not reused once the user sets a joint-graph pass of their own (which keeps
    the pass out of chunk compiles), nor for eager's op-by-op sizing."""
    from torch._inductor import config

    from streamfx import memory

    class Graph:
        def key(self):
            return ("a graph",)

    monkeypatch.setattr(memory, "_CURVES", {})
    monkeypatch.setattr(memory, "_trace_curve", lambda graph, grads, train, fused, one_hot: (fused, one_hot))
    assert memory.chunk_curve(Graph(), (0,), True, fused=True) == (True, onehot.compiles_with_pass())
    with config.patch(joint_custom_post_pass=lambda graph: None):
        assert not onehot.compiles_with_pass() and onehot.compile_config() == {}
        assert memory.chunk_curve(Graph(), (0,), True, fused=True) == (True, False)
    assert memory.chunk_curve(Graph(), (0,), True, fused=False) == (False, False)
    assert onehot.ONE_HOT_PASS is None or memory.chunk_curve(Graph(), (0,), True, fused=True) == (True, True)


@pytest.mark.fast
@pytest.mark.skipif(onehot.ONE_HOT_PASS is None, reason="this Inductor has no custom passes")
def test_cached_chunk_compiles_are_keyed_by_the_code_that_guards_them(tmp_path, monkeypatch):
    """The pass's hash is part of every chunk compile's cache key: it covers chunks.py, whose shape
    guards decide which sizes a compile's code serves, so an entry written by another version of
    it (one that served sizes this one guards against) is never loaded."""
    import os
    import shutil

    from torch._inductor.custom_graph_pass import get_hash_for_files

    from streamfx import chunks

    assert any(os.path.samefile(p, chunks.__file__) for p in onehot.HASHED)
    copies = []
    for p in onehot.HASHED:
        copies.append(str(tmp_path / os.path.basename(p)))
        shutil.copy(p, copies[-1])
    monkeypatch.setattr(onehot, "HASHED", tuple(copies))
    get_hash_for_files.cache_clear()
    before = onehot.ONE_HOT_PASS.uuid()
    with open(copies[[os.path.basename(p) for p in copies].index("chunks.py")], "a") as f:
        f.write("\n# another version\n")
    get_hash_for_files.cache_clear()
    assert onehot.ONE_HOT_PASS.uuid() != before
    get_hash_for_files.cache_clear()
