"""One-hot gradients made pointwise in the chunk graphs Inductor compiles for training.

The gradient of ``gather`` (a loss picking each row's target log-probability) is
``zeros.scatter_add(dim, index, grad)``: Inductor lowers it as a zero fill of the whole
[tokens, vocabulary] tensor and a scatter into it, which the log-softmax's gradient then reads
twice (its row sum, then each element): per chunk of the head, one logits-sized buffer and three
passes over it. Where the index holds one entry per row along ``dim`` and spans the zeros
elsewhere, the same values are ``where(iota(dim) == index, grad, 0)`` (Inductor's joint-graph
pattern ``scatter_upon_const_tensor`` does this for a scalar scattered into a constant, as
``nll_loss``'s gradient is; here the values are a tensor), and their sum along ``dim`` is
``grad`` itself. With both, Inductor fuses the one-hot into the kernel that reads it: no buffer.

The values are the same bits: every position holds 0 + value or 0, as the scatter gives it, and
a row's sum adds one value to zeros. ``rewrite`` is the one place the form is recognised: the
chunk compile runs it on its joint graph (``ONE_HOT_PASS``) and the memory model on the graph it
sizes (``memory._trace_curve``), so the predicted working set is the one the compiled code has.
"""
from __future__ import annotations

import math
import os

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

aten = torch.ops.aten

# ops that make a tensor of zeros: the position of their fill argument, None where they take none
_ZEROS = {aten.full.default: 1, aten.new_full.default: 2, aten.zeros.default: None,
          aten.new_zeros.default: None, aten.zeros_like.default: None}


def _val(a):
    return a.meta.get("val") if isinstance(a, fx.Node) else None


def _zeros(n) -> bool:
    if not isinstance(n, fx.Node) or n.op != "call_function" or n.target not in _ZEROS:
        return False
    at = _ZEROS[n.target]
    return at is None or (len(n.args) > at and n.args[at] == 0)


def one_hot_scatter(n: fx.Node) -> bool:
    """``scatter_add(zeros, dim, index, src)`` with one index per row along ``dim``, the index and
    ``src`` spanning the zeros in every other dim, and the zeros read by nothing else."""
    if n.op != "call_function" or n.target is not aten.scatter_add.default or len(n.args) != 4 or n.kwargs:
        return False
    x, dim, index, src = n.args
    if not _zeros(x) or len(x.users) != 1 or not isinstance(dim, int):
        return False
    xv, iv, sv = _val(x), _val(index), _val(src)
    if not all(isinstance(v, torch.Tensor) for v in (xv, iv, sv)) or not xv.dtype.is_floating_point \
            or sv.dtype != xv.dtype or xv.dim() == 0 or iv.dim() != xv.dim() or sv.dim() != xv.dim():
        return False
    dim = dim % xv.dim()
    if not isinstance(xv.shape[dim], int) or iv.shape[dim] != 1:
        return False
    return all(statically_known_true(iv.shape[d] == xv.shape[d]) for d in range(xv.dim()) if d != dim) \
        and all(statically_known_true(sv.shape[d] == iv.shape[d]) for d in range(xv.dim()))


def _row_sum(u: fx.Node, dim: int, ndim: int):
    """Whether ``u`` sums its input along ``dim`` alone, in the input's dtype: its keepdim, or None."""
    if u.op != "call_function" or u.target is not aten.sum.dim_IntList or u.kwargs.get("dtype") is not None:
        return None
    dims = u.args[1] if len(u.args) > 1 else u.kwargs.get("dim")
    if not isinstance(dims, (list, tuple)) or len(dims) != 1 or not isinstance(dims[0], int) or dims[0] % ndim != dim:
        return None
    keep = u.args[2] if len(u.args) > 2 else u.kwargs.get("keepdim", False)
    return bool(keep)


def _fake_mode(vals: dict) -> tuple:
    """The fake mode the values share (a compile's), or, where they have none in common (a graph
    traced with real tensors), a fresh one with fake copies of them: (mode, node -> fake value)."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        mode = detect_fake_mode(list(vals.values()))
    except AssertionError:   # (values of several modes)
        mode = None
    if mode is not None:
        return mode, dict(vals)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        return mode, {n: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=v.device)
                      for n, v in vals.items()}


def rewrite(graph: fx.Graph) -> int:
    """Replace every ``one_hot_scatter`` of ``graph`` by its pointwise form, and each sum of it
    along the one-hot dim by its values; returns how many one-hot scatters were replaced."""
    done = 0
    for n in list(graph.nodes):
        if not one_hot_scatter(n):
            continue
        x, dim, index, src = n.args
        xv, iv, sv = _val(x), _val(index), _val(src)
        dim = dim % xv.dim()
        shape = [1] * xv.dim()
        shape[dim] = xv.shape[dim]
        mode, fakes = _fake_mode({index: iv, src: sv})

        def add(target, args, kwargs=None):
            node = graph.call_function(target, args, kwargs or {})
            vals = [fakes.get(a, _val(a)) if isinstance(a, fx.Node) else a for a in args]
            with mode:
                node.meta["val"] = fakes[node] = target(*vals, **(kwargs or {}))
            return node

        with graph.inserting_before(n):
            iota = add(torch.ops.prims.iota.default, (xv.shape[dim],),
                       {"start": 0, "step": 1, "dtype": iv.dtype, "device": xv.device, "requires_grad": False})
            mask = add(aten.eq.Tensor, (index, add(aten.view.default, (iota, shape))))
            zero = add(aten.scalar_tensor.default, (0.0,), {"dtype": xv.dtype, "device": xv.device})
            new = add(aten.where.self, (mask, src, zero))
        new.meta.update({k: v for k, v in n.meta.items() if k != "val"})
        n.replace_all_uses_with(new)
        graph.erase_node(n)
        graph.erase_node(x)
        for total, chain in _row_sums(new, dim, xv.dim()):
            # the sum of (the chain's ops applied to) the one-hot is (those ops applied to) its values
            with graph.inserting_before(total):
                value = src
                for op in chain:
                    value = add(op.target, (value, *op.args[1:]))
                if not _row_sum(total, dim, xv.dim()):
                    value = add(aten.squeeze.dim, (value, dim))
            total.replace_all_uses_with(value)
            graph.erase_node(total)
            for op in reversed(chain):
                if not op.users:
                    graph.erase_node(op)
        if not new.users:
            for node in (new, zero, mask, mask.args[1], iota):
                graph.erase_node(node)
        done += 1
    return done


# elementwise ops that keep zeros zero (a Python number the other operand, finite): through them, a
# one-hot stays one-hot; the op of each, and where its number stands
_ZERO_KEEPING = {aten.neg.default: None, aten.mul.Tensor: 1, aten.div.Tensor: 1}


def _row_sums(node: fx.Node, dim: int, ndim: int, chain=()) -> list:
    """(sum, ops between) for each sum along ``dim`` of the one-hot ``node``, directly or through
    ops that keep its zeros zero."""
    out = []
    for u in list(node.users):
        if u.op != "call_function" or not u.args or u.args[0] is not node:
            continue
        if _row_sum(u, dim, ndim) is not None:
            out.append((u, chain))
        elif u.target in _ZERO_KEEPING and not u.kwargs:
            at = _ZERO_KEEPING[u.target]
            if at is not None:
                c = u.args[at] if len(u.args) > at else None
                if not isinstance(c, (int, float)) or isinstance(c, bool) or not math.isfinite(c) \
                        or (u.target is aten.div.Tensor and c == 0):
                    continue
            out += _row_sums(u, dim, ndim, (*chain, u))
    return out


# (this file, and chunks.py: the shape guards of a chunk compile and when the caches are used)
HASHED = (__file__, os.path.join(os.path.dirname(__file__), "chunks.py"))


def _pass():
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
    except ImportError:   # (an Inductor without custom passes: chunk graphs compile as they are)
        return None

    class OneHotPass(CustomGraphPass):
        """``rewrite`` as an Inductor joint-graph pass. Its hash, part of the key of every chunk
        compile's entries in Inductor's and AOTAutograd's caches, is that of ``HASHED``: the code
        that decides what a chunk compile's code may serve, so entries another version of it wrote
        (which served sizes this one guards against) are never loaded."""

        def __call__(self, graph: fx.Graph) -> None:
            rewrite(graph)

        def uuid(self):
            return get_hash_for_files(HASHED)

    return OneHotPass()


ONE_HOT_PASS = _pass()


def compiles_with_pass() -> bool:
    """Whether a chunk's training compile runs ``ONE_HOT_PASS`` now: it does unless this Inductor
    has no custom passes or the user has set a joint-graph pass of their own (which is kept)."""
    from torch._inductor import config

    return ONE_HOT_PASS is not None and config.joint_custom_post_pass is None


def compile_config() -> dict:
    """The Inductor config a chunk compile patches in: the pass, where ``compiles_with_pass``."""
    return {"joint_custom_post_pass": ONE_HOT_PASS} if compiles_with_pass() else {}
