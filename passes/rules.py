"""Per-op axis rules, registered in families (pointwise, reduction, view, contraction, ...).

A rule is ``rule(node, table, ax) -> RuleOut``: ``table`` is the AxisTable (fresh axes, unification,
view regrouping), ``ax(x)`` gives the axes of an input node. Rules are pure apart from unifying
axes in ``table``. ``reduced`` / ``mixed`` name (input node, dim) pairs; the driver decides what a
reduced or mixed sequence dim means for the node's class.
"""
from __future__ import annotations

import operator

import sympy
import torch
import torch.fx as fx

from .axes import AxisTable, RuleOut
from .graphs import bind, normalize_dim, same, unpadded, val as tensor_meta
from .kernels import size_expr
from .stops import STOP

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
    """Right-aligned broadcasting: non-size-1 dims of all inputs that line up are one axis. A flat
    dim lined up with a product of axes (random numbers drawn as ``[B*T, E]`` beside tokens
    flattened to ``[B*T, E]``: Phi-3.5-MoE's router) is that product, and a product lined up with
    an older flat axis it was split from (a scan's ``[T/2, 2]`` halves merged back beside the
    tokens) is that axis (``AxisTable.identify``)."""
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
            if len(d) == 1 and len(dims[0]) > 1:
                table.identify(d, dims[0], keep_older=True)
            elif len(dims[0]) == 1 and len(d) > 1:
                table.identify(dims[0], d, keep_older=True)
            else:
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


# Collectives (communication between processes: tensor parallelism written with them) are not
# run per chunk: a chunk's collective must be matched by every process running the same chunks,
# and the chunk sizes may differ between processes (a memory budget reads each one's free memory).
COLLECTIVE_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d", "_dtensor")
COLLECTIVE = ("it communicates between processes (tensor parallelism written with collectives), which streaming "
              "does not run per chunk: every process would have to run the same chunks")


def is_collective(op) -> bool:
    """Whether ``op`` (an FX node's target) is a collective (``COLLECTIVE_NAMESPACES``)."""
    return getattr(op, "namespace", None) in COLLECTIVE_NAMESPACES


def is_pointwise(op) -> bool:
    return torch.Tag.pointwise in getattr(op, "tags", ())


@register(aten.binary_cross_entropy.default)
def binary_cross_entropy(node, table, ax):
    """Per element with no reduction (the backend keeps it whole and reduces after it), else a
    reduction over every dim of its input."""
    if bind(node).get("reduction", 1) == 0:
        return pointwise(node, table, ax)
    x = node.args[0]
    return RuleOut([()], reduced=tuple((x, k) for k in range(len(shape(x)))))


register(aten.where.self, aten.clone.default, aten._to_copy.default, aten.alias.default,
         aten.detach.default, aten.lift_fresh_copy.default, aten.copy.default,
         aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.threshold_backward.default,
         aten.native_dropout_backward.default, aten.fill.Scalar, aten.zeros_like.default,
         aten.ones_like.default, aten.full_like.default, aten.empty_like.default, STOP)(pointwise)




# ---- reduction family ----------------------------------------------------------------------------
# Every ATen overload tagged ``reduction`` (sum, mean, amax, any.dims, var.dim, norm, aminmax, ...)
# and the order statistics that carry no tag, read by one rule: the dims named by the schema's
# ``dim`` argument (every dim when it is absent, None or empty), kept when ``keepdim``.
ORDER_STATISTICS = {aten.median.default, aten.median.dim, aten.nanmedian.default, aten.nanmedian.dim,
                    aten.mode.default, aten.kthvalue.default}


def is_reduction(op) -> bool:
    """Whether ``op`` reduces dims of its first tensor argument (functional overloads only)."""
    if op in ORDER_STATISTICS:
        return True
    schema = getattr(op, "_schema", None)
    if schema is None or torch.Tag.reduction not in getattr(op, "tags", ()):
        return False
    args = schema.arguments
    return bool(args) and str(args[0].type) == "Tensor" and not any(a.is_out or a.alias_info is not None
                                                                     and a.alias_info.is_write for a in args)


def reduction(node, table, ax):
    x = node.args[0]
    a, n = ax(x), len(shape(x))
    b = bind(node)
    dims = _bound_dims(b.get("dim"), n)
    kept = tuple((() if k in dims else a[k]) for k in range(n))
    out = kept if b.get("keepdim", False) else tuple(a[k] for k in range(n) if k not in dims)
    n_out = len(node.meta["val"]) if isinstance(node.meta["val"], (tuple, list)) else 1
    if node.target is aten.sum.dim_IntList and _only_group_sizes(node, table):
        return RuleOut([out] * n_out)  # counted per chunk, with that chunk's rows
    return RuleOut([out] * n_out, reduced=tuple((x, k) for k in dims))


def _bound_dims(d, n: int) -> list[int]:
    """The dims a reduction's ``dim`` argument names: every dim for None or an empty list."""
    if d is None:
        return list(range(n))
    d = [d] if isinstance(d, int) else list(d)
    return [normalize_dim(k, n) for k in d] or list(range(n))


@register(aten.linalg_vector_norm.default)
def vector_norm(node, table, ax):
    """A p-norm over ``dim`` (every dim when None): a reduction of those dims."""
    x = node.args[0]
    a, n, b = ax(x), len(shape(x)), bind(node)
    d = b.get("dim")
    dims = list(range(n)) if d is None else ([normalize_dim(v, n) for v in (d if isinstance(d, (list, tuple)) else [d])]
                                            or list(range(n)))
    out = tuple((() if k in dims else a[k]) for k in range(n)) if b.get("keepdim") else \
        tuple(a[k] for k in range(n) if k not in dims)
    return RuleOut([out], reduced=tuple((x, k) for k in dims))


@register(aten._softmax.default, aten._log_softmax.default, aten._safe_softmax.default, aten.cumsum.default,
          aten.cumprod.default, aten.flip.default,
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


@register(aten.topk.default)
def topk(node, table, ax):
    """The k largest along a dim: a new axis of k entries there."""
    a, d = list(ax(node.args[0])), normalize_dim(bind(node)["dim"], len(shape(node.args[0])))
    a[d] = table.fresh(out_shape_of(node, 0)[d])
    return RuleOut([tuple(a)] * 2, mixed=((node.args[0], d),))


@register(aten.glu.default)
def glu(node, table, ax):
    """A gated linear unit: the first half of a dim times the sigmoid of the second; a new axis of
    half the size there, the halves combined along it."""
    x = node.args[0]
    a, d = list(ax(x)), normalize_dim(bind(node).get("dim", -1), len(shape(x)))
    a[d] = table.fresh(tuple(node.meta["val"].shape)[d])
    return RuleOut([tuple(a)], mixed=((x, d),))


@register(aten.glu_backward.default)
def glu_backward(node, table, ax):
    x = node.args[1]
    return RuleOut([ax(x)], mixed=((x, normalize_dim(node.args[2], len(shape(x)))),))


def out_shape_of(node: fx.Node, i: int) -> tuple:
    return tuple(node.meta["val"][i].shape)


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
    lost: list = []
    out = table.regroup(ax(x), shape(x), out_shape(node), lost)
    # a dim split into new axes (the tokens viewed as [T/2, 2] pairs): its positions are combined
    # into others, which no chunk of tokens holds whole (mixing where the dim is the sequence)
    return RuleOut([out], mixed=tuple((x, k) for k in lost))


@register(aten.view_as_complex.default)
def view_as_complex(node, table, ax):
    """[..., 2] reals as [...] complex numbers (a rotary embedding in complex form): the pair dim
    goes, every other dim keeps its axis."""
    return RuleOut([tuple(ax(node.args[0]))[:-1]])


@register(aten.view_as_real.default)
def view_as_real(node, table, ax):
    return RuleOut([tuple(ax(node.args[0])) + (table.fresh(2),)])


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
    if unpadded(node) is not None:  # a pad taken back off: the unpadded tensor's dims
        return RuleOut([tuple(ax(unpadded(node)))])
    a, n = list(ax(x)), len(shape(x))
    d = normalize_dim(node.args[1] if len(node.args) > 1 else 0, n)
    if same(shape(x)[d], out_shape(node)[d]):
        return RuleOut([tuple(a)])
    rows = _unshifted(node, a[d], d, table)
    if rows is not None:
        a[d] = rows
        return RuleOut([tuple(a)], mixed=((x, d),))
    group = _sliced_group(node, a[d], table)
    if group is not None:
        a[d] = group
        return RuleOut([tuple(a)])
    sliced = a[d]
    a[d] = table.fresh(out_shape(node)[d])
    if len(sliced) == 1 and len(a[d]) == 1:
        table.slices.append((a[d][0], sliced[0]))
    return RuleOut([tuple(a)], mixed=((x, d),))


def _unshifted(node, dim, d: int, table):
    """The rows' axis where ``node`` slices a shifted dim (``AxisTable.shifted``) back to exactly
    its rows (``conv1d(x, padding=k - 1)[..., :T]``), else None."""
    shift = table.shift_of(dim) if dim else None
    if shift is None or (shift[1], shift[2]) == (0, 0) or node.target is not aten.slice.Tensor:
        return None
    b = bind(node)
    if b.get("step", 1) != 1 or (b.get("start") or 0) != shift[1] \
            or not same(out_shape(node)[d], table.size[shift[0]]):
        return None
    return (shift[0],)


@register(aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int)
def split(node, table, ax):
    x = node.args[0]
    a, n = ax(x), len(shape(x))
    d = normalize_dim(node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0), n)
    if node.target is aten.split_with_sizes.default and split_groups(node.args[1], a[d], table):
        # rows sorted by id, split into one group per id: each piece holds some of the tokens
        sizes = tuple(node.args[1])
        outs = [tuple(a[:d]) + (table.group(a[d], sizes, i, v.shape[d]),) + tuple(a[d + 1:])
                for i, v in enumerate(node.meta["val"])]
        return RuleOut(outs)
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
    rows = regrouped(node.args[0], d, table, ax)
    if rows is not None:  # the groups of a split sorted dim, back together in their order
        a[d] = rows
        return RuleOut([tuple(a)])
    shifted = token_shift(node)
    if shifted is not None:   # rows moved later by n (``attention.shift_site``): lined up with them
        x = shifted[0]
        a[d] = ax(x)[d]
        return RuleOut([tuple(a)], mixed=((x, d),))
    along = {table.canon(ax(x)[d]) for x in xs}
    if len(xs) > 1 and len(along) == 1 and len(next(iter(along))) == 1:
        # pieces that share one axis along d are stacked: element (i, t) is piece i's row t
        # (torch.stack of per-row results decomposes to this cat and a view)
        a[d] = table.fresh(len(xs)) + next(iter(along))
        return RuleOut([tuple(a)])
    if len(xs) > 1 and along == {()}:
        # columns of one value each stacked side by side (Phi-MoE's first and second expert and
        # their weights: ``cat((w1, w2), -1)``, ``cat((e1, e2), -1)``): column i is piece i, so
        # two such stacks over the same rows share their column axis, as topk's values and
        # indices do
        key = (len(xs),) + tuple(table.canon(a[k]) for k in range(n) if k != d)
        a[d] = table.stacks.setdefault(key, table.fresh(len(xs)))
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


def token_shift(node) -> tuple | None:
    """(x, dim, n) where ``node`` is x with its rows along ``dim`` moved n later (n >= 1) and the
    first n filled: ``cat([fill, x[..., :-n]], dim)`` (n rows of anything before the rows of x
    but its last n: Zaya's delayed values, a token shift), ``F.pad`` by n before and -n after
    (RWKV's ``ZeroPad2d((0, 0, 1, -1))``). Row t of the result reads row t - n of x only (none,
    for t < n): a causal mixing of reach n (``attention.shift_site``). None for anything else."""
    if node.op != "call_function":
        return None
    if node.target is aten.cat.default:
        xs = list(node.args[0])
        n_dims = len(out_shape(node))
        d = normalize_dim(node.args[1] if len(node.args) > 1 else 0, n_dims)
        if len(xs) != 2 or not all(isinstance(p, fx.Node) for p in xs) or xs[1].target is not aten.slice.Tensor:
            return None
        fill, part = xs
        b, x = bind(part), part.args[0]
        n = shape(fill)[d] if len(shape(fill)) == n_dims else None
        if not isinstance(n, int) or n < 1 or not isinstance(x, fx.Node) or len(shape(x)) != n_dims \
                or normalize_dim(b.get("dim", 0), n_dims) != d or b.get("step", 1) != 1 or (b.get("start") or 0) != 0 \
                or not same(out_shape(node)[d], shape(x)[d]) or not same(shape(part)[d] + n, shape(x)[d]):
            return None
        return x, d, n
    if node.target is aten.constant_pad_nd.default:
        x, pads = node.args[0], list(node.args[1])
        if not isinstance(x, fx.Node) or not all(isinstance(p, int) for p in pads):
            return None
        moved = [(len(shape(x)) - 1 - i, pads[2 * i]) for i in range(len(pads) // 2) if pads[2 * i] or pads[2 * i + 1]]
        if len(moved) != 1:
            return None
        d, n = moved[0]
        i = len(shape(x)) - 1 - d
        return (x, d, n) if n >= 1 and pads[2 * i + 1] == -n else None
    return None


@register(aten.constant_pad_nd.default)
def pad(node, table, ax):
    x = node.args[0]
    a, pads = list(ax(x)), node.args[1]
    shifted = token_shift(node)
    if shifted is not None:   # rows moved later by n (``attention.shift_site``): lined up with them
        return RuleOut([tuple(a)], mixed=((x, shifted[1]),))
    mixed = []
    for i in range(len(pads) // 2):
        d = len(a) - 1 - i
        left, right = pads[2 * i], pads[2 * i + 1]
        if left or right:
            shift = table.shift_of(a[d]) if a[d] else None
            if shift is not None and isinstance(left, int) and isinstance(right, int) and left >= 0 and right >= 0:
                # rows moved by ``left`` (a causal convolution's left padding): recorded, so the
                # convolution after it can line its output up with the rows again
                a[d] = table.shifted_dim(shift[0], shift[1] + left, shift[2] + right, out_shape(node)[d])
            else:
                a[d] = table.fresh(out_shape(node)[d])
            mixed.append((x, d))
    return RuleOut([tuple(a)], mixed=tuple(mixed))


def conv_step(node) -> tuple | None:
    """(padding, reach) of a 1-D convolution with stride 1 and static sizes, whose output element j
    reads elements j .. j + reach of its input padded by ``padding`` on each side (reach =
    (k - 1)·dilation); None for any other convolution."""
    w = node.args[1]
    stride, padding, dilation, transposed = (tuple(node.args[3:7]) + (None,) * 4)[:4]
    k = shape(w)[-1] if len(shape(w)) == 3 else None
    if transposed or list(stride or ()) != [1] or len(padding or ()) != 1 or not isinstance(k, int) \
            or not isinstance(padding[0], int) or not isinstance(dilation[0], int):
        return None
    return padding[0], (k - 1) * dilation[0]


@register(aten.convolution.default)
def convolution(node, table, ax):
    """A convolution mixes positions along its spatial dims. A 1-D one with stride 1 lines its
    output up with its input's rows: output element j reads input elements j .. j + (k - 1)·dil
    of the padded input, so it belongs to the input's row j + (k - 1)·dil - padding - left (its
    last tap, ``shifted``): an output whose rows are the input's from the first on (left >= 0)
    reads each row's own and earlier rows only, a causal convolution (``attention.conv_site``)."""
    x = node.args[0]
    a, out = ax(x), out_shape(node)
    axes = [a[0] if len(a) else (), table.fresh(out[1])]
    step = conv_step(node)
    shift = table.shift_of(a[2]) if step is not None and a[2] else None
    if shift is not None and shift[1] + step[0] - step[1] >= 0:
        padding, reach = step
        axes.append(table.shifted_dim(shift[0], shift[1] + padding - reach, shift[2] + padding, out[2]))
        return RuleOut([tuple(axes)], mixed=((x, 2),))
    axes += [table.fresh(n) for n in out[2:]]
    return RuleOut([tuple(axes)], mixed=tuple((x, d) for d in range(2, len(out))))


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
    """Tiling: a dim repeated once keeps its axis; a new leading dim is a new axis; a dim tiled r
    times holds r copies one after another, position i * n + j being copy i of position j: the
    product of a new axis of r copies (outer) and the dim's own axis (inner), as a reshape of
    [r, n] (Llama 4's experts each read every token: ``hidden.repeat(num_experts, 1)``)."""
    x, reps = node.args[0], list(node.args[1])
    a, shp = ax(x), out_shape(node)
    lead = len(reps) - len(a)
    out = []
    for k in range(len(reps)):
        if k < lead:
            out.append(table.fresh(shp[k]))
        elif same(reps[k], 1):
            out.append(a[k - lead])
        else:
            out.append(tuple(table.fresh(reps[k])) + tuple(a[k - lead]))
    return RuleOut([tuple(out)])


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
    """Writes along dim ``d`` at the index's positions; along every other dim, position i of the
    index (and of the source) writes position i of the result: those dims are one axis. (A mask
    built by scattering into ``zeros_like(scores)``, DeepSeek-V3's group routing, keeps the
    tokens' axis of its index, not the fresh one of the created zeros.)"""
    x = node.args[0]
    n = len(shape(x))
    d = normalize_dim(node.args[1], n)
    out = ax(x)
    for v in node.args[2:4]:  # the index, and the source of scatter.src / scatter_add
        if not isinstance(v, fx.Node) or len(shape(v)) != n:
            continue
        for k in range(n):
            # a merged axis (batch x tokens) identifies one created axis too
            if k != d and same(shape(v)[k], shape(x)[k]) and ax(v)[k] and len(ax(v)[k]) >= len(out[k]):
                table.identify(out[k], ax(v)[k])
    return RuleOut([out], mixed=((x, d),))


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


@register(aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default, aten.sym_storage_offset.default)
def size_query(node, table, ax):
    """A size read from a tensor (a graph piece's symbolic length) mixes no positions."""
    return RuleOut([None])


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


# Creation ops whose every element holds one value (or none: ``empty``): made at a chunk's sizes,
# they hold what the whole tensor holds at the chunk's rows. Any other tensor made from sizes alone
# (``arange``, ``iota``: positions) holds values that depend on where its rows sit in the sequence.
UNIFORM_CREATION = {aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format,
                    aten.empty_strided.default, aten.empty_permuted.default, aten.new_zeros.default,
                    aten.new_ones.default, aten.new_empty.default, aten.new_full.default, aten.scalar_tensor.default}


# ---- permutations of tokens (a mixture-of-experts dispatch) ----------------------------------
# ``sort`` along a dim reorders its rows: the result is on a permuted copy of that axis
# (``AxisTable.permuted``), the indices hold positions of the original. A gather by such an
# index (``x[perm // k]``), a grouped matmul whose groups are counted from the sorted ids, and the
# inverse permutation (``inv[perm] = arange``, ``y[inv]``) move rows between the two orders and
# compute nothing across tokens: per chunk of tokens they permute that chunk's rows and back.
# ``seq_dims._check_permutations`` refuses a permuted axis that meets its original order.
@register(aten.sort.default, aten.sort.stable)
def sort(node, table, ax):
    x = node.args[0]
    a = list(ax(x))
    d = normalize_dim(bind(node).get("dim", -1), len(a))
    a[d] = table.permuted(a[d], node)
    return RuleOut([tuple(a)] * 2)


VALUE_COPIES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.clone.default,
                aten._to_copy.default, aten.alias.default, torch.ops.prims.convert_element_type.default, STOP)


def index_target(x, table, ax):
    """The atoms of the dim whose positions the integer tensor ``x`` holds, or None: a sort's
    indices hold positions of the sorted dim, ``arange`` / ``iota`` those of its own dim, a floor
    division by the size of trailing atoms those of the leading ones (``perm // top_k``: the token
    of an expert slot), ``index_put(dst, [i], v)`` those ``v`` holds."""
    if not isinstance(x, fx.Node) or x.op != "call_function":
        return None
    t = x.target
    if t is operator.getitem and x.args[0].target in (aten.sort.default, aten.sort.stable) and x.args[1] == 1:
        return table.canon(table.perms[x.args[0]][1]) if x.args[0] in table.perms else None
    if _enumerates(x):
        return table.canon(ax(x)[0])
    if t in VALUE_COPIES and len(shape(x)) == len(shape(x.args[0])) == 1:
        return index_target(x.args[0], table, ax)
    if t is aten.div.Tensor_mode and x.kwargs.get("rounding_mode") in ("floor", "trunc") \
            and isinstance(x.args[1], int) and x.args[1] > 0:  # (positions are >= 0: trunc is floor)
        atoms, c = index_target(x.args[0], table, ax), x.args[1]
        while atoms and not same(c, 1):
            size = table.size[atoms[-1]]
            if not (isinstance(size, int) and c % size == 0):
                return None
            atoms, c = atoms[:-1], c // size
        return atoms if atoms and same(c, 1) else None
    if t is aten.index_put.default and len(x.args) > 2 and not (len(x.args) > 3 and x.args[3]):
        return index_target(x.args[2], table, ax)
    return None


def _enumerates(x) -> bool:
    """Whether ``x`` holds 0, 1, ..., n-1: the positions of its own (one) dim."""
    if not isinstance(x, fx.Node) or x.op != "call_function" or len(shape(x)) != 1:
        return False
    if x.target is torch.ops.prims.iota.default:
        return x.kwargs.get("start", 0) == 0 and x.kwargs.get("step", 1) == 1
    return x.target is aten.arange.default


def _one_index(indices):
    """(dim, index node) of an advanced index with one index tensor, or None."""
    used = [(d, i) for d, i in enumerate(indices) if i is not None]
    return used[0] if len(used) == 1 and isinstance(used[0][1], fx.Node) else None


def _gathers_rows(x_dim, idx, table, ax, x=None) -> bool:
    """True when ``idx`` holds positions of dim ``x_dim`` computed from the same tokens. Where
    the two differ only in axes along which ``x`` holds copies of one value (Ergo's
    ``hidden.repeat_interleave(top_k, 0)``: a row per route, gathered by route positions), those
    axes are made one: any copy is the same row."""
    target = index_target(idx, table, ax)
    if target is None:
        return False
    mine = table.canon(x_dim)
    if target == mine:
        return True
    if x is None or len(target) != len(mine):
        return False
    copied = _copied_atoms(x, table, ax)
    pairs = [(p, q) for p, q in zip(mine, target) if p != q]
    if not all(p in copied and same(table.size[p], table.size[q]) for p, q in pairs):
        return False
    for p, q in pairs:
        table.unify((p,), (q,))
    return True


def _copied_atoms(x, table, ax) -> set:
    """Root atoms along which ``x`` holds copies of one value: the dims an ``expand`` made from
    size-1 (or new) dims, seen through the views and copies between it and ``x``."""
    copied = set()
    while isinstance(x, fx.Node) and x.op == "call_function" and isinstance(x.args[0], fx.Node) and (
            x.target in VALUE_COPIES or x.target in (aten.expand.default, aten.unsqueeze.default)):
        if x.target is aten.expand.default:
            before = {a for d in ax(x.args[0]) for a in table.canon(d)}
            copied |= {a for d in ax(x) for a in table.canon(d)} - before
        x = x.args[0]
    return copied


def _gather(node, table, ax, x, d, idx):
    a = ax(x)
    out = tuple(a[:d]) + tuple(ax(idx)) + tuple(a[d + 1:])
    mixed = () if not a[d] or _gathers_rows(a[d], idx, table, ax, x) else ((x, d),)
    return RuleOut([out], mixed=mixed)


@register(aten.index.Tensor)
def index(node, table, ax):
    """``x[idx]`` along one dim: a lookup where the dim holds no tokens (an expert's bias by its
    id), a reordering of rows where ``idx`` holds positions of the same tokens, else mixing.
    ``x[i0, i1, ...]`` by 1-D indices on adjacent dims: element k of the result reads x at
    (i0[k], i1[k], ...), so the indices line up element by element (as a pointwise op's inputs
    do); a dim indexed by positions of its own rows (``lp[arange(n), labels]``: each token's
    row) is read row by row, any other indexed dim is a lookup (mixed)."""
    x, indices = node.args[0], node.args[1]
    one = _one_index(indices)
    if one is not None and len(shape(one[1])) == 1:
        return _gather(node, table, ax, x, one[0], one[1])
    several = _adjacent_indices(indices)
    out = _index_aligned(table, ax, x, several) if several is not None else None
    if out is None:
        return RuleOut([table.fresh_like(out_shape(node))], mixed=tuple((x, k) for k in range(len(shape(x)))))
    return out


def _index_aligned(table, ax, x, several):
    """``x[i0, i1, ...]`` (``several``: their (dim, index) pairs) with the indices aligned on one
    axis, or None where they cannot be."""
    a, first, k = ax(x), several[0][0], len(several)
    for d, i in several:   # (an arange as long as the dim it indexes enumerates that dim's rows)
        if a[d] and _enumerates(i) and same(shape(i)[0], shape(x)[d]):
            table.identify(ax(i)[0], a[d])
    ref = max((i for _, i in several), key=lambda i: len(table.canon(ax(i)[0])))
    for _, i in several:
        if i is not ref and len(table.canon(ax(i)[0])) in (1, len(table.canon(ax(ref)[0]))):
            table.identify(ax(i)[0], ax(ref)[0])
    if len({table.canon(ax(i)[0]) for _, i in several}) != 1:
        return None
    mixed = tuple((x, d) for d, i in several if a[d] and not _gathers_rows(a[d], i, table, ax, x))
    return RuleOut([tuple(a[:first]) + (ax(ref)[0],) + tuple(a[first + k:])], mixed=mixed)


def _adjacent_indices(indices):
    """[(dim, index node)] of an advanced index by two or more 1-D index tensors of one length on
    adjacent dims, or None."""
    used = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(used) < 2 or not all(isinstance(i, fx.Node) and len(shape(i)) == 1 for _, i in used):
        return None
    if [d for d, _ in used] != list(range(used[0][0], used[0][0] + len(used))):
        return None
    return used if all(same(shape(i)[0], shape(used[0][1])[0]) for _, i in used) else None


@register(aten.index_select.default)
def index_select(node, table, ax):
    x, d, idx = node.args[0], node.args[1], node.args[2]
    return _gather(node, table, ax, x, normalize_dim(d, len(shape(x))), idx)


@register(aten.index_put.default)
def index_put(node, table, ax):
    """``dst[i] = v`` with ``i`` a sort's indices (a permutation of dst's rows, each written
    once): the inverse permutation ``inv[perm] = arange`` holds, per token, its sorted row."""
    dst, indices, v = node.args[0], node.args[1], node.args[2]
    accumulate = len(node.args) > 3 and node.args[3]
    one = _one_index(indices)
    n = len(shape(dst))
    if one is None or one[0] != 0 or len(shape(one[1])) != 1:
        return RuleOut([ax(dst)], mixed=tuple((dst, k) for k in range(n)))
    i = one[1]
    if accumulate:
        return _add_rows(dst, i, v, table, ax)
    target = index_target(i, table, ax)
    if target is None or not i.op == "call_function" or i.target is not operator.getitem \
            or not same(shape(dst)[0], shape(i)[0]):
        return RuleOut([ax(dst)], mixed=((dst, 0),))
    if not any(isinstance(tensor_meta(y), torch.Tensor) for y in dst.all_input_nodes):
        table.identify(ax(dst)[0], target)  # a flat empty(n): made per chunk at the tokens' sizes
    if shape(v) and len(shape(v)) == n:
        table.identify(ax(v)[0], ax(i)[0])
    return RuleOut([(target,) + tuple(ax(dst)[1:])])


def _add_rows(dst, i, v, table, ax):
    """``dst[i] += v`` along dim 0 (``index_add``), with ``i`` holding, per row of ``v``, the
    position of its token in ``dst`` (``perm // top_k``: the token of each expert slot): each
    token's row sums its own slots. Into zeros made for it, or into rows of the same tokens."""
    target = index_target(i, table, ax)
    n = len(shape(dst))
    a = ax(dst)
    if target is None or not shape(v) or not (len(shape(v)) == n or (n == 1 and len(shape(v)) == 0)):
        return RuleOut([a], mixed=((dst, 0),))
    if not any(isinstance(tensor_meta(y), torch.Tensor) for y in dst.all_input_nodes):
        if not same(shape(dst)[0], table._size_of(target)):
            # rows of another table indexed by positions (a learned position embedding's
            # gradient, ``zeros(max_positions).index_put_([arange(T)], g, accumulate=True)``)
            return RuleOut([a], mixed=tuple((dst, k) for k in range(n)))
        table.identify(a[0], target)  # zeros made for the tokens: made per chunk at their size
    elif table.canon(a[0]) != table.canon(target):
        return RuleOut([a], mixed=((dst, 0),))
    if len(shape(v)) == n:
        table.unify(ax(v)[0], ax(i)[0])
        for k in range(1, n):
            table.unify(ax(v)[k], a[k])
    return RuleOut([(target,) + tuple(a[1:])])


@register(aten.index_add.default)
def index_add(node, table, ax):
    """``dst.index_add(dim, i, v)``: along dim 0, rows of the same tokens added (``_add_rows``)."""
    dst, d, i, v = node.args[:4]
    n = len(shape(dst))
    if normalize_dim(d, n) != 0 or len(shape(i)) != 1 or (len(node.args) > 4 and node.args[4] != 1) \
            or node.kwargs.get("alpha", 1) != 1:
        return RuleOut([ax(dst)], mixed=((dst, normalize_dim(d, n)),))
    return _add_rows(dst, i, v, table, ax)


# by name: a library's custom op exists only once the library is imported
GROUPED_MM = ("aten::_grouped_mm", "transformers::grouped_mm_fallback")
GROUPED_MM_BACKWARD = ("transformers::grouped_mm_fallback_backward",)  # (input, weight, offs, grad)


def op_name(target) -> str | None:
    name = getattr(target, "name", None)
    return name() if callable(name) and isinstance(target, torch._ops.OpOverload) else None


def _source(x):
    """``x`` through value copies and views: the tensor whose values it holds."""
    while isinstance(x, fx.Node) and x.op == "call_function" and x.target in VALUE_COPIES:
        x = x.args[0]
    return x


def _group_offsets_of(offs, rows, table) -> bool:
    """True when ``offs`` are the group ends of rows sorted by ``sort``: ``cumsum`` of a
    ``histc`` / ``bincount`` of the sorted ids whose sorted dim is ``rows``."""
    n = offs
    while isinstance(n, fx.Node) and n.op == "call_function" and n.target in VALUE_COPIES + (aten.cumsum.default,):
        n = n.args[0]
    if not (isinstance(n, fx.Node) and n.target in (aten.histc.default, aten.bincount.default)):
        return False
    ids = _source(n.args[0])
    if not (isinstance(ids, fx.Node) and ids.target is operator.getitem and ids.args[1] == 0):
        return False
    sort_node = ids.args[0]
    return sort_node in table.perms and table.canon(table.perms[sort_node][0]) == table.canon(rows)


def grouped_mm(node, table, ax):
    """Rows of ``x`` times the weight of their group (``offs``: the groups' ends): a matmul per
    row when the groups are those of the sort that ordered the rows."""
    x, w = node.args[0], node.args[1]
    offs = node.args[2] if len(node.args) > 2 else node.kwargs.get("offs")
    a, b = ax(x), ax(w)
    table.unify(a[-1], b[-2])
    rows_ok = len(shape(x)) == 2 and len(shape(w)) == 3 and _group_offsets_of(offs, a[0], table)
    return RuleOut([(a[0], b[-1])], reduced=((x, 1), (w, 1)), mixed=() if rows_ok else ((x, 0),))


NAMED_RULES = {name: grouped_mm for name in GROUPED_MM}


# ---- groups of sorted rows: a split by the tokens per id (JetMoE's experts) ---------------------
# ``counts = one_hot(ids).sum(0)`` (or ``bincount(ids)``), read with ``.tolist()`` as the sizes of
# a split of the rows that an ascending sort of the same ids ordered: piece i holds the rows of id
# i, a matmul per piece is a matmul per row, and a cat of every piece in order puts the rows back.
# Per chunk of tokens the chunk counts its own ids and splits its own rows: no position of
# another token is read. The counts are sizes only: a count used as a value stays a sum over the
# sequence.
def counted_ids(counts):
    """The ids whose occurrences ``counts`` holds per id (``counts[e]``: how many ids equal e), or
    None: ``histc`` / ``bincount`` of the ids, or a sum over every dim but the last of their
    one-hot rows (1 scattered into zeros along the last dim, or ``ids[..., None] == arange(E)``)."""
    n = _source(counts)
    if not (isinstance(n, fx.Node) and n.op == "call_function"):
        return None
    if n.target in (aten.histc.default, aten.bincount.default):
        return n.args[0]
    if n.target is not aten.sum.dim_IntList:
        return None
    x = n.args[0]
    k = len(shape(x))
    if sorted(dims_arg(n, 1, k)) != list(range(k - 1)) or bind(n).get("keepdim"):
        return None
    hot = _source(x)
    if not isinstance(hot, fx.Node) or hot.op != "call_function":
        return None
    if hot.target is aten.scatter.value and normalize_dim(hot.args[1], k) == k - 1 and hot.args[3] == 1 \
            and len(shape(hot.args[2])) == k and _zeros(hot.args[0]):
        return hot.args[2]
    if hot.target is aten.eq.Tensor:
        ids, classes = hot.args[0], hot.args[1]
        if isinstance(ids, fx.Node) and ids.target is aten.unsqueeze.default \
                and normalize_dim(ids.args[1], k) == k - 1 and isinstance(classes, fx.Node) \
                and classes.target in (aten.arange.default, aten.arange.start, torch.ops.prims.iota.default) \
                and len(shape(classes)) == 1:
            start = classes.args[0] if classes.target is aten.arange.start else 0
            return ids.args[0] if start == 0 else None
    return None


def _zeros(x) -> bool:
    if not isinstance(x, fx.Node) or x.op != "call_function":
        return False
    if x.target in (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default):
        return True
    return x.target is aten.full.default and x.args[1] == 0


def sorted_by(ids, rows, table):
    """The sort node that ordered ``rows`` by ``ids`` ascending, or None."""
    for node, (new, _) in table.perms.items():
        if _source(node.args[0]) is _source(ids) and not bind(node).get("descending", False) \
                and (rows is None or table.canon(new) == table.canon(rows)):
            return node
    return None


def _sorted_somewhere(ids) -> bool:
    """True when an ascending sort reads ``ids`` (through value copies and views)."""
    todo, seen = [ids], set()
    while todo:
        n = todo.pop()
        for u in n.users:
            if u in seen:
                continue
            seen.add(u)
            if u.target in (aten.sort.default, aten.sort.stable) and not bind(u).get("descending", False):
                return True
            if u.target in VALUE_COPIES and u.args[0] is n:
                todo.append(u)
    return False


def split_groups(sizes, rows, table) -> bool:
    """True when ``sizes`` are the group sizes of ``rows`` sorted by id: entry i is the count of id
    i (``counts[i].item()``, every id in order), counted from the ids whose ascending sort ordered
    ``rows``."""
    if not isinstance(sizes, (list, tuple)) or not sizes or not rows:
        return False
    counts = None
    for i, size in enumerate(sizes):
        if not (isinstance(size, fx.Node) and size.target is aten._local_scalar_dense.default):
            return False
        picked = _entry(size.args[0])
        if picked is None or picked[1] != i or (counts is not None and picked[0] is not counts):
            return False
        counts = picked[0]
    if len(shape(counts)) != 1 or not same(shape(counts)[0], len(sizes)):
        return False
    ids = counted_ids(counts)
    return ids is not None and sorted_by(ids, rows, table) is not None


def _only_group_sizes(node, table) -> bool:
    """True when ``node``'s counts are read only as the sizes of splits of rows sorted by the
    counted ids (whether each split's rows are those rows is the split's rule), and in size
    arithmetic: never as values."""
    ids = counted_ids(node)
    if ids is None or not _sorted_somewhere(_source(ids)):
        return False
    splits, picks = [], []
    for u in node.users:
        if u.target is aten.unbind.int:   # (its entries: ``_entry`` checks the dim)
            picks.extend(u.users)
        else:
            picks.append(u)
    for pick in picks:
        if _entry(pick) is None:
            return False
        for size in pick.users:
            if size.target is not aten._local_scalar_dense.default or not _used_as_size(size, splits):
                return False
    return bool(splits)


def _entry(pick):
    """(counts, i) when ``pick`` is entry i of a 1-d ``counts``: ``select(counts, 0, i)`` or
    ``unbind(counts)[i]`` (how ``.tolist()`` reads it), else None."""
    if not isinstance(pick, fx.Node) or pick.op != "call_function":
        return None
    if pick.target is aten.select.int and pick.args[1] == 0 and isinstance(pick.args[2], int):
        return pick.args[0], pick.args[2]
    if pick.target is operator.getitem and isinstance(pick.args[0], fx.Node) \
            and pick.args[0].target is aten.unbind.int and (pick.args[0].args[1] if len(pick.args[0].args) > 1 else 0) == 0:
        return pick.args[0].args[0], pick.args[1]
    return None


def _used_as_size(sym, splits, seen=None) -> bool:
    """Every use of the integer ``sym`` is a size: of a split (collected), a slice's bounds, or
    integer arithmetic and assertions on sizes."""
    seen = set() if seen is None else seen
    for u in sym.users:
        if u in seen:
            continue
        seen.add(u)
        v = u.meta.get("val")
        if u.target is aten.split_with_sizes.default and u.args[0] is not sym:
            splits.append(u)
        elif u.target in (aten.slice.Tensor, aten.narrow.default) and u.args[0] is not sym:
            continue
        elif u.target is aten._assert_scalar.default:
            continue
        elif isinstance(v, (torch.SymInt, torch.SymBool, int, bool)):
            if not _used_as_size(u, splits, seen):
                return False
        else:
            return False
    return True


def _size_expr(x):
    """An int size, or a graph node's SymInt as its expression; None for anything else."""
    v = size_expr(x.meta.get("val") if isinstance(x, fx.Node) else x)
    return v if isinstance(v, (int, sympy.Expr)) else None


def regrouped(xs, d, table, ax):
    """The sorted dim whose groups ``xs`` are along ``d``, every one in order, or None."""
    if not xs or not all(isinstance(x, fx.Node) for x in xs):
        return None
    groups = [table.group_of(ax(x)[d]) if len(ax(x)) > d else None for x in xs]
    if any(g is None for g in groups):
        return None
    rows, sizes = groups[0][0], groups[0][1]
    if len(sizes) != len(xs) or any(g[0] != rows or g[1] != sizes or g[2] != i for i, g in enumerate(groups)):
        return None
    return rows


def _sliced_group(node, dim, table):
    """The group atom that ``x[start:end]`` along a dim split into groups takes (the backward of
    their cat: bounds that are sums of the group sizes before it and up to it), or None."""
    b = bind(node) if node.target is aten.slice.Tensor else None
    if b is None or b.get("step", 1) != 1:
        return None
    rows = table.canon(dim)
    for atom, (g_rows, sizes, i) in table.groups.items():
        if table.canon(g_rows) != rows:
            continue
        exprs = [_size_expr(s) for s in sizes]
        start, end = _size_expr(b.get("start") or 0), _size_expr(b.get("end"))
        if any(e is None for e in exprs) or start is None or end is None:
            return None
        to_end = isinstance(end, int) and end >= (1 << 62) and i == len(sizes) - 1
        if sympy.expand(start - sum(exprs[:i])) == 0 and (to_end or sympy.expand(end - sum(exprs[:i + 1])) == 0):
            return (atom,)
    return None


def rule_for(target):
    """The rule of an op: registered by overload, or by name (``namespace::op``); a reduction's
    when the op is one (``is_reduction``)."""
    return RULES.get(target) or NAMED_RULES.get(op_name(target)) or (reduction if is_reduction(target) else None)


@register(aten.histc.default, aten.bincount.default)
def histogram(node, table, ax):
    """Counts over a dim: a sum over the sequence, except the group sizes of a grouped matmul
    over rows sorted by the counted ids, or of a split of those rows into groups (counted per
    chunk, with that chunk's rows)."""
    x = node.args[0]
    reduced = tuple((x, k) for k in range(len(shape(x))))
    if _only_group_offsets(node, table) or _only_group_sizes(node, table):
        reduced = ()
    return RuleOut([table.fresh_like(out_shape(node))], reduced=reduced)


def _only_group_offsets(node, table) -> bool:
    users, seen = list(node.users), set()
    if not users:
        return False
    while users:
        u = users.pop()
        if u in seen:
            continue
        seen.add(u)
        if u.target in VALUE_COPIES + (aten.cumsum.default,):
            users.extend(u.users)
            if not u.users:
                return False
        elif op_name(u.target) in GROUPED_MM + GROUPED_MM_BACKWARD:
            offs = u.args[2] if len(u.args) > 2 else u.kwargs.get("offs")
            if offs is not node and offs not in seen:
                return False
        else:
            return False
    return True


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
