"""Per-op axis rules, registered in families (pointwise, reduction, view, contraction, ...).

A rule is ``rule(node, table, ax) -> RuleOut``: ``table`` is the AxisTable (fresh axes, unification,
view regrouping), ``ax(x)`` gives the axes of an input node. Rules are pure apart from unifying
axes in ``table``. ``reduced`` / ``mixed`` name (input node, dim) pairs; the driver decides what a
reduced or mixed sequence dim means for the node's class.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .axes import AxisTable, RuleOut
from .graphs import bind, normalize_dim, same, val as tensor_meta

aten = torch.ops.aten
RULES: dict = {}


def register(*ops):
    def deco(fn):
        for op in ops:
            RULES[op] = fn
        return fn
    return deco


def shape(x) -> tuple:
    v = tensor_meta(x)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else ()


def out_shape(node: fx.Node) -> tuple:
    return tuple(node.meta["val"].shape)


def dims_arg(node: fx.Node, pos: int, ndim: int, default=None) -> list[int]:
    d = node.args[pos] if len(node.args) > pos else node.kwargs.get("dim", default)
    if d is None:
        return list(range(ndim))
    d = [d] if isinstance(d, int) else list(d)
    return [normalize_dim(x, ndim) for x in d] or list(range(ndim))


def broadcast(node, table: AxisTable, ax, inputs) -> tuple:
    """Right-aligned broadcasting: non-size-1 dims of all inputs that line up are one axis."""
    shp = out_shape(node)
    result = []
    for k in range(len(shp)):
        dims = []
        for x in inputs:
            s, a = shape(x), ax(x)
            j = k - (len(shp) - len(s))
            if j >= 0 and a[j]:
                dims.append(a[j])
        for d in dims[1:]:
            table.unify(dims[0], d)
        result.append(dims[0] if dims else table.fresh(shp[k]))
    return tuple(result)


# ---- pointwise family: every op tagged pointwise, plus a few untagged ones --------------------
def pointwise(node, table, ax):
    tensors = [x for x in _flat_nodes(node) if isinstance(tensor_meta(x), torch.Tensor)]
    return RuleOut([broadcast(node, table, ax, tensors)])


def _flat_nodes(node):
    out = []
    fx.node.map_arg((node.args, node.kwargs), out.append)
    return out


def is_pointwise(op) -> bool:
    return torch.Tag.pointwise in getattr(op, "tags", ())


register(aten.where.self, aten.clone.default, aten._to_copy.default, aten.alias.default,
         aten.detach.default, aten.lift_fresh_copy.default, aten.copy.default,
         aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.threshold_backward.default,
         aten.native_dropout_backward.default, aten.fill.Scalar, aten.zeros_like.default,
         aten.ones_like.default, aten.full_like.default, aten.empty_like.default)(pointwise)


# ---- reduction family ----------------------------------------------------------------------------
@register(aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default,
          aten.sum.default, aten.mean.default, aten.var.correction, aten.logsumexp.default,
          aten.prod.dim_int, aten.any.dim, aten.all.dim, aten.argmax.default, aten.argmin.default,
          aten.max.dim, aten.min.dim, aten.var_mean.correction, aten.std.correction)
def reduction(node, table, ax):
    x = node.args[0]
    a, n = ax(x), len(shape(x))
    dims = dims_arg(node, 1, n) if node.target not in (aten.sum.default, aten.mean.default) else list(range(n))
    kept = tuple((() if k in dims else a[k]) for k in range(n))
    keepdim = node.kwargs.get("keepdim", node.args[2] if len(node.args) > 2 and isinstance(node.args[2], bool) else False)
    out = kept if keepdim else tuple(a[k] for k in range(n) if k not in dims)
    n_out = len(node.meta["val"]) if isinstance(node.meta["val"], (tuple, list)) else 1
    return RuleOut([out] * n_out, reduced=tuple((x, k) for k in dims))


@register(aten._softmax.default, aten._log_softmax.default, aten._safe_softmax.default, aten.cumsum.default,
          aten.cumprod.default, aten.sort.default, aten.topk.default, aten.flip.default,
          aten.roll.default, aten.cummax.default, aten.cummin.default, aten.logcumsumexp.default)
def along_dim(node, table, ax):
    """Ops that combine values along dims without removing them (softmax, cumsum, sort, flip...)."""
    x = node.args[0]
    n = len(shape(x))
    b = bind(node)
    d = b["dims"] if "dims" in b else b.get("dim", -1)
    dims = [normalize_dim(v, n) for v in (d if isinstance(d, (list, tuple)) else [d])] or list(range(n))
    n_out = len(node.meta["val"]) if isinstance(node.meta["val"], (tuple, list)) else 1
    return RuleOut([ax(x)] * n_out, mixed=tuple((x, k) for k in dims))


@register(aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)
def along_dim_backward(node, table, ax):
    g, y, d = node.args[0], node.args[1], node.args[2]
    out = broadcast(node, table, ax, [g, y])
    return RuleOut([out], mixed=((g, normalize_dim(d, len(out))),))


@register(aten.native_layer_norm.default)
def layer_norm(node, table, ax):
    x, normalized = node.args[0], node.args[1]
    a, n = ax(x), len(shape(x))
    lead = n - len(normalized)
    stats = tuple(a[:lead]) + ((),) * len(normalized)
    return RuleOut([a, stats, stats], reduced=tuple((x, k) for k in range(lead, n)))


@register(aten.native_layer_norm_backward.default)
def layer_norm_backward(node, table, ax):
    g, x, normalized = node.args[0], node.args[1], node.args[2]
    a, n = broadcast(node_like(node, 0), table, ax, [g, x]), len(shape(x))
    lead = n - len(normalized)
    w_axes = tuple(a[lead:])
    return RuleOut([a, w_axes, w_axes], reduced=tuple((x, k) for k in range(lead)))


class node_like:
    """A stand-in node whose 'val' is one output of a multi-output node (for broadcast())."""

    def __init__(self, node, i):
        self.meta = {"val": node.meta["val"][i]}


# ---- view / layout family ------------------------------------------------------------------------
@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.expand.default, aten.view.dtype)
def view(node, table, ax):
    x = node.args[0]
    if node.target is aten.expand.default:
        shp, s = out_shape(node), shape(x)
        lead = len(shp) - len(s)
        return RuleOut([tuple(table.fresh(shp[k]) if k < lead or not ax(x)[k - lead] else ax(x)[k - lead]
                              for k in range(len(shp)))])
    return RuleOut([table.regroup(ax(x), shape(x), out_shape(node))])


@register(aten.permute.default)
def permute(node, table, ax):
    a = ax(node.args[0])
    return RuleOut([tuple(a[normalize_dim(d, len(a))] for d in node.args[1])])


@register(aten.transpose.int)
def transpose(node, table, ax):
    a = list(ax(node.args[0]))
    i, j = (normalize_dim(d, len(a)) for d in node.args[1:3])
    a[i], a[j] = a[j], a[i]
    return RuleOut([tuple(a)])


@register(aten.t.default)
def t(node, table, ax):
    return RuleOut([tuple(reversed(ax(node.args[0])))])


@register(aten.unsqueeze.default)
def unsqueeze(node, table, ax):
    a = list(ax(node.args[0]))
    a.insert(normalize_dim(node.args[1], len(a) + 1), ())
    return RuleOut([tuple(a)])


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.select.int)
def squeeze_or_select(node, table, ax):
    x = node.args[0]
    a, n = ax(x), len(shape(x))
    if node.target is aten.squeeze.default:
        return RuleOut([tuple(d for d, s in zip(a, shape(x)) if not same(s, 1))])
    dims = dims_arg(node, 1, n)
    reduced = ((x, dims[0]),) if node.target is aten.select.int else ()
    return RuleOut([tuple(a[k] for k in range(n) if k not in dims)], mixed=reduced)


@register(aten.slice.Tensor, aten.narrow.default)
def slice_(node, table, ax):
    """A slice keeps its dim's axis only if it is the whole dim; a part of a dim is a shift: a new
    axis, recorded as a slice of the old one (a part of the sequence is a sequence too)."""
    x = node.args[0]
    a, n = list(ax(x)), len(shape(x))
    d = normalize_dim(node.args[1] if len(node.args) > 1 else 0, n)
    if same(shape(x)[d], out_shape(node)[d]):
        return RuleOut([tuple(a)])
    sliced = a[d]
    a[d] = table.fresh(out_shape(node)[d])
    if len(sliced) == 1 and len(a[d]) == 1:
        table.slices.append((a[d][0], sliced[0]))
    return RuleOut([tuple(a)], mixed=((x, d),))


@register(aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int)
def split(node, table, ax):
    x = node.args[0]
    a, n = ax(x), len(shape(x))
    d = normalize_dim(node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0), n)
    if node.target is aten.unbind.int:
        d = normalize_dim(node.args[1] if len(node.args) > 1 else 0, n)
    outs = []
    for v in node.meta["val"]:
        b = list(a)
        if node.target is aten.unbind.int:
            b.pop(d)
        elif not same(v.shape[d], shape(x)[d]):
            b[d] = table.fresh(v.shape[d])
        outs.append(tuple(b))
    return RuleOut(outs, mixed=((x, d),) if len(node.meta["val"]) > 1 else ())


@register(aten.cat.default)
def cat(node, table, ax):
    xs = [x for x in node.args[0] if not (len(shape(x)) == 1 and same(shape(x)[0], 0))]
    n = len(out_shape(node))
    d = normalize_dim(node.args[1] if len(node.args) > 1 else 0, n)
    a = list(broadcast_except(node, table, ax, xs, d))
    along = {table.canon(ax(x)[d]) for x in xs}
    if len(xs) > 1 and len(along) == 1 and len(next(iter(along))) == 1:
        # pieces that share one axis along d are stacked: element (i, t) is piece i's row t
        # (torch.stack of per-row results decomposes to this cat and a view)
        a[d] = table.fresh(len(xs)) + next(iter(along))
        return RuleOut([tuple(a)])
    a[d] = table.fresh(out_shape(node)[d]) if len(xs) > 1 else ax(xs[0])[d]
    return RuleOut([tuple(a)], mixed=tuple((x, d) for x in xs) if len(xs) > 1 else ())


def broadcast_except(node, table, ax, xs, d):
    shp = out_shape(node)
    result = []
    for k in range(len(shp)):
        dims = [ax(x)[k] for x in xs if ax(x)[k]] if k != d else []
        for dd in dims[1:]:
            table.unify(dims[0], dd)
        result.append(dims[0] if dims else ())
    return result


@register(aten.constant_pad_nd.default)
def pad(node, table, ax):
    x = node.args[0]
    a, pads = list(ax(x)), node.args[1]
    mixed = []
    for i in range(len(pads) // 2):
        d = len(a) - 1 - i
        if pads[2 * i] or pads[2 * i + 1]:
            a[d] = table.fresh(out_shape(node)[d])
            mixed.append((x, d))
    return RuleOut([tuple(a)], mixed=tuple(mixed))


# ---- contraction family ----------------------------------------------------------------------
@register(aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default)
def matmul(node, table, ax):
    off = 1 if node.target in (aten.addmm.default, aten.baddbmm.default) else 0
    x, y = node.args[off], node.args[off + 1]
    a, b = ax(x), ax(y)
    table.unify(a[-1], b[-2])
    for i in range(len(a) - 2):
        table.unify(a[i], b[i])
    out = tuple(a[:-1]) + (b[-1],)
    if off:  # the added input broadcasts against the product
        bias = node.args[0]
        for k, dim in enumerate(ax(bias)):
            j = k + len(out) - len(shape(bias))
            if dim and out[j]:
                table.unify(dim, out[j])
    return RuleOut([out], reduced=((x, len(a) - 1), (y, len(b) - 2)))


@register(aten.repeat.default)
def repeat(node, table, ax):
    """Tiling: a dim repeated once keeps its axis; a tiled dim or a new leading one is a new axis."""
    x, reps = node.args[0], list(node.args[1])
    a, shp = ax(x), out_shape(node)
    lead = len(reps) - len(a)
    out = [table.fresh(shp[k]) if k < lead or not same(reps[k], 1) else a[k - lead] for k in range(len(reps))]
    return RuleOut([tuple(out)], mixed=tuple((x, k - lead) for k in range(lead, len(reps)) if not same(reps[k], 1)))


# ---- lookups, creation, losses ---------------------------------------------------------------
@register(aten.embedding.default)
def embedding(node, table, ax):
    w, idx = node.args[0], node.args[1]
    return RuleOut([tuple(ax(idx)) + (ax(w)[1],)])


@register(aten.embedding_dense_backward.default)
def embedding_backward(node, table, ax):
    g, idx = node.args[0], node.args[1]
    n = len(shape(idx))
    return RuleOut([(table.fresh(out_shape(node)[0]), ax(g)[-1])], reduced=tuple((g, k) for k in range(n)))


@register(aten.gather.default)
def gather(node, table, ax):
    x, d, idx = node.args[0], node.args[1], node.args[2]
    n = len(shape(x))
    d = normalize_dim(d, n)
    a, b = ax(x), ax(idx)
    for k in range(n):
        if k != d:
            table.unify(a[k], b[k])
    return RuleOut([tuple(b)], mixed=((x, d),))


@register(aten.scatter.src, aten.scatter.value, aten.scatter_add.default)
def scatter(node, table, ax):
    x = node.args[0]
    d = normalize_dim(node.args[1], len(shape(x)))
    return RuleOut([ax(x)], mixed=((x, d),))


@register(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss(node, table, ax):
    x, target = node.args[0], node.args[1]
    table.unify(ax(x)[0], ax(target)[0]) if len(shape(x)) > 1 and shape(target) else None
    reduction = node.args[3]
    out = tuple(ax(target)) if reduction == 0 else ()
    reduced = () if reduction == 0 else tuple((target, k) for k in range(len(shape(target))))
    return RuleOut([out, ()], reduced=reduced)


@register(aten.nll_loss_backward.default)
def nll_loss_backward(node, table, ax):
    return RuleOut([ax(node.args[1])])


@register(aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format,
          aten.arange.default, aten.arange.start, aten.arange.start_step, aten.scalar_tensor.default,
          aten.randn.default, aten.rand.default, aten.empty_strided.default, aten.new_zeros.default,
          aten.new_ones.default, aten.new_empty.default, aten.new_full.default, aten.tril.default,
          aten.triu.default, aten.eye.default)
def creation(node, table, ax):
    """Creation ops start fresh axes; tril/triu keep their input's axes but mix its last two dims."""
    if node.target in (aten.tril.default, aten.triu.default):
        x = node.args[0]
        n = len(shape(x))
        return RuleOut([ax(x)], mixed=((x, n - 2), (x, n - 1)))
    return RuleOut([table.fresh_like(out_shape(node))])


@register(aten.index.Tensor)
def index(node, table, ax):
    """``x[..., idx, ...]`` (advanced indexing): the indexed dims are replaced by the broadcast
    dims of the index tensors (in place when the indexed dims are adjacent, first otherwise);
    the other dims keep their axes. Only the indexed dims mix positions."""
    x, indices = node.args[0], list(node.args[1])
    a, n = ax(x), len(shape(x))
    indexed = [d for d, i in enumerate(indices) if i is not None]
    idx = [i for i in indices if i is not None]
    if any(tensor_meta(i).dtype == torch.bool for i in idx):  # a boolean mask selects data-dependent rows
        return RuleOut([table.fresh_like(out_shape(node))], mixed=tuple((x, d) for d in range(n)))
    width = max(len(shape(i)) for i in idx)
    lead = [()] * width
    for i in idx:
        for k, dim in enumerate(ax(i)):
            j = k + width - len(shape(i))
            if dim and lead[j]:
                table.unify(lead[j], dim)
            lead[j] = lead[j] or dim
    lead = [d or table.fresh(s) for d, s in zip(lead, out_shape(node)[indexed[0]:] if indexed == list(
        range(indexed[0], indexed[-1] + 1)) else out_shape(node))]
    rest = [a[d] for d in range(n) if d not in indexed]
    if indexed == list(range(indexed[0], indexed[-1] + 1)):
        out = list(a[:indexed[0]]) + lead + list(a[indexed[-1] + 1:])
    else:
        out = lead + rest
    return RuleOut([tuple(out)], mixed=tuple((x, d) for d in indexed))


@register(aten.slice_scatter.default, aten.select_scatter.default)
def slice_scatter(node, table, ax):
    """``base`` with ``src`` written into a part of dim d (MLA assembles its keys this way): the
    output has base's axes; src lines up with base off dim d; only dim d mixes positions."""
    base, src = node.args[0], node.args[1]
    a, b = ax(base), list(ax(src))
    d = normalize_dim(node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0), len(a))
    if node.target is aten.select_scatter.default:
        b.insert(d, ())
    for k in range(len(a)):
        if k != d and k < len(b):
            table.unify(a[k], b[k])
    return RuleOut([a], mixed=((base, d),))
