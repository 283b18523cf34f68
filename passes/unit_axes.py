"""The per-token rule of a unit (``units``): where a Function with its own backward may run per chunk.

``signature`` traces the unit's forward and backward together to ATen and runs the axis
analysis over them. The unit's rule (``rule``) lines its outputs' dims up with its inputs' dims
and reports as mixed every dim along which the Function combines positions: a mixing op
(cumsum, softmax along it, a sort), a reduction whose result does not only flow linearly into
the gradient of an input without that dim (a weight gradient is a sum over the tokens; chunks
add up), a size read as a number, or an op no rule knows. A unit that mixes the sequence is then
unknown-mixing, and its region is refused with the op that mixes (``refusal``).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx
from torch.fx import traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx

from streamfx.errors import CannotStream, op_name, source_line
from .rules import COLLECTIVE, is_collective, register
from .units import _UNITS, UNIT, Unit, _fake_mode, _forward, _grads, _read

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class Signature:
    """Axes of a unit's tensor inputs and outputs (per tensor, per dim, a tuple of atoms of the
    unit's own axis table); ``mixed``: atoms along which it combines positions, each with the
    op that does it (name and source line)."""
    ins: tuple
    outs: tuple
    sizes: dict
    mixed: dict
    ops: frozenset = frozenset()  # the ATen ops of its bodies (a Function wrapping a linear projects)
    collective: str = ""          # the first collective of its bodies (name and source line), or ""


# ops through which a sum over a dim stays a sum of per-chunk parts (with operands free of it)
LINEAR = frozenset({
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.dim, aten.squeeze.dims,
    aten.squeeze.default, aten.unsqueeze.default, aten.permute.default, aten.t.default, aten.transpose.int,
    aten.expand.default, aten.clone.default, aten.alias.default, aten._to_copy.default,
    torch.ops.prims.convert_element_type.default, aten.sum.dim_IntList, aten.sum.default, aten.add.Tensor,
    aten.sub.Tensor, aten.neg.default, aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar,
    aten.mm.default, aten.bmm.default})


def signature(unit: Unit, vals) -> Signature:
    """The unit's forward and backward traced to ATen together, and the axis analysis over them
    (see the module doc)."""
    from torch._inductor.decomposition import select_decomp_table

    from .graphs import node_inputs
    from .seq_dims import infer_axes

    mode = _fake_mode(vals)
    with mode:
        outs = _forward(unit, vals)
    cots = [torch.empty_like(o) for o in outs[:unit.n_out]]
    n_in, n_res = len(vals), len(outs)

    def combined(*args):
        xs, gs = args[:n_in], args[n_in:]
        res = _forward(unit, xs)
        saved = [_read(w, xs, res) for w in unit.saved if w[0] in ("in", "out")]
        sizes = [_read(w, xs) for w in unit.saved if w[0] == "size"]
        return tuple(res) + tuple(_grads(unit, gs, saved, sizes))

    # (functional: a backward that writes into a buffer it made, ``scatter_add_``, is read as its
    # functional op, which has a rule)
    with mode, fx_traceback.preserve_node_meta():
        gm = make_fx(torch.func.functionalize(combined), decomposition_table=select_decomp_table())(*vals, *cots)
    sd = infer_axes(gm.graph)
    table = sd.table
    phs = gm.graph.find_nodes(op="placeholder")
    results = list(gm.graph.find_nodes(op="output")[0].args[0])
    # a gradient has the axes of its output, an input's gradient those of the input
    pairs = list(zip(phs[n_in:], results)) + [(results[n_res + k], phs[unit.args[j][1]])
                                              for k, j in enumerate(unit.grads)]
    for x, y in pairs:
        ax_x, ax_y = (sd.axes.get(x) or [None])[0], (sd.axes.get(y) or [None])[0]
        if ax_x is not None and ax_y is not None and len(ax_x) == len(ax_y):
            for a, b in zip(ax_x, ax_y):
                table.unify(a, b)
    canon = lambda node: tuple(table.canon(d) for d in sd.axes[node][0])  # noqa: E731
    ins = [canon(p) for p in phs[:n_in]]
    # the input each gradient result belongs to
    grad_of = {n_res + k: unit.args[j][1] for k, j in enumerate(unit.grads)}
    mixed: dict = {}

    def mark(atoms, node):
        for a in atoms:
            mixed.setdefault(table.find(a), node)

    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node in sd.unknown:
            for x in node_inputs(node):
                for d in canon(x):
                    mark(d, node)
        for x, d in sd.mixed.get(node, ()):
            mark(table.canon(sd.axes[x][0][d]), node)
        for x, d in sd.reduced.get(node, ()):
            atoms = set(table.canon(sd.axes[x][0][d]))
            if atoms and not _sums_into_gradients(node, atoms, sd, table, results, grad_of, ins):
                mark(atoms, node)
        if node.target is aten.sym_size.int and _used_as_value(node):
            # a length read as a number (``x * x.shape[1]``): per chunk it would be the chunk's
            mark(table.canon(sd.axes[node.args[0]][0][node.args[1]]), node)
    return Signature(tuple(ins), tuple(canon(o) for o in results[:n_res]),
                     {a: table.size[a] for a in table.parent if table.find(a) == a},
                     {a: _describe(node) for a, node in mixed.items()},
                     frozenset(n.target for n in gm.graph.nodes if n.op == "call_function"),
                     next((_describe(n) for n in gm.graph.nodes if n.op == "call_function" and is_collective(n.target)),
                          ""))


def _sums_into_gradients(node, atoms, sd, table, results, grad_of, ins) -> bool:
    """Whether a sum over ``atoms`` reaches the unit's results only through ``LINEAR`` ops whose
    other operands carry no such sum, and only as the gradient of inputs without those atoms
    (a weight's gradient: summed over chunks, it is the whole sequence's)."""
    def over(n):
        return any(set(table.canon(sd.axes[x][0][d])) & atoms for x, d in sd.reduced.get(n, ()))

    carried, stack = {node}, [node]
    while stack:  # every value computed from a sum over the atoms
        for u in stack.pop().users:
            if u not in carried and u.op != "output":
                carried.add(u)
                stack.append(u)
    carried |= {n for n in node.graph.nodes if over(n)}
    seen, stack = {node}, [node]
    while stack:
        n = stack.pop()
        for u in n.users:
            if u.op == "output":
                for k, r in enumerate(results):
                    if r is n and (k not in grad_of or any(set(d) & atoms for d in ins[grad_of[k]])):
                        return False
                continue
            if u.target not in LINEAR:
                return False
            if u.target in PRODUCTS and not _linear_in(u, n, carried):
                return False
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return True


PRODUCTS = frozenset({aten.mul.Tensor, aten.mul.Scalar, aten.div.Tensor, aten.div.Scalar, aten.mm.default,
                      aten.bmm.default})


def _linear_in(u: fx.Node, n: fx.Node, carried: set) -> bool:
    """Whether product ``u`` is linear in ``n``: ``n`` is its only factor that carries a sum,
    once, and not a divisor."""
    tensors = [a for a in u.args if isinstance(a, fx.Node)]
    if u.target in (aten.div.Tensor, aten.div.Scalar) and u.args[0] is not n:
        return False
    return tensors.count(n) == 1 and not any(x in carried for x in tensors if x is not n)


def _used_as_value(size: fx.Node) -> bool:
    """Whether a size reaches anything but the size arguments of views, expands and new
    tensors (directly or through arithmetic on sizes)."""
    from .graphs import SIZE_ARG_OPS

    for u in size.users:
        if u.op == "output":
            return True
        if isinstance(u.meta.get("val"), torch.SymInt):  # arithmetic on sizes
            if _used_as_value(u):
                return True
            continue
        pos = SIZE_ARG_OPS.get(u.target)
        if pos is None or pos >= len(u.args) or size not in list(u.args[pos]) or \
                any(a is size for i, a in enumerate(u.args) if i != pos):
            return True
    return False


def _describe(node: fx.Node) -> str:
    return f"{op_name(node)}{source_line(node)}"


def rule(node, table, ax):
    """The unit's axes: each output dim is the input dims its atoms come from (fresh where none
    does); inputs' dims that share an atom in the unit become one axis; dims along which the
    unit combines positions are mixed."""
    from .axes import RuleOut

    sig = _UNITS[node.args[0]].signature
    xs = [x for x in node.args[1]]
    amap, mixed = {}, []
    for x, dims in zip(xs, sig.ins):
        for d, (sub, main) in enumerate(zip(dims, ax(x))):
            if any(a in sig.mixed for a in sub):
                mixed.append((x, d))
            if len(sub) == len(main):
                for s, a in zip(sub, main):
                    table.unify(amap.setdefault(s, (a,)), (a,))
            elif len(sub) == 1:  # (a dim the unit sees as one axis: B and T merged outside it)
                table.unify(amap.setdefault(sub[0], tuple(main)), tuple(main))
    outs = []
    for dims in sig.outs:
        out = []
        for sub in dims:
            atoms: tuple = ()
            for s in sub:
                if s not in amap:
                    amap[s] = table.fresh(sig.sizes[s])
                atoms += amap[s]
            out.append(atoms)
        outs.append(tuple(out))
    return RuleOut(outs, mixed=tuple(mixed))


def refusal(node: fx.Node, sd) -> CannotStream | None:
    """Why a unit that combines positions along the sequence cannot stream (the op that does it),
    or None for any other node."""
    if node.op != "call_function" or node.target is not UNIT:
        return None
    unit = _UNITS[node.args[0]]
    ops = []
    for x, dims in zip(node.args[1], unit.signature.ins):
        d = sd.seq_dim(x)
        ops += [unit.signature.mixed[a] for a in (dims[d] if d is not None else ()) if a in unit.signature.mixed]
    streams = "a hook streams when each token's gradient depends only on that token's rows" if unit.hook else \
        ("a Function streams when each token's outputs and input gradients depend only on that token's rows "
         "(sums over the tokens only in weight gradients)")
    if unit.signature.collective and ops:
        return CannotStream(f"{unit.describe()} calls a collective ({unit.signature.collective}): {COLLECTIVE}; "
                            "its region runs unstreamed", node)
    return CannotStream(
        f"{unit.describe()} combines positions along the sequence "
        f"({'; '.join(sorted(set(ops))[:2]) or 'in its outputs'}), so it cannot run per chunk of tokens "
        f"and its region runs unstreamed; {streams}", node)


register(UNIT)(rule)  # a Function with its own backward: its axes from its bodies (``rule``)
