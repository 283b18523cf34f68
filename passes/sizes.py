"""Size arguments rebuilt from the axes of their dims, so one graph serves every length.

A copy of joint-graph nodes (a region instantiated for a chunk, a path rebuilt on a slice of the
sequence) cannot keep the joint's size arguments: view shapes, expand sizes and creation shapes
are constants or Dynamo shape symbols (s0 = B, s1 = T, ...) of the whole sequence. Each size is
rebuilt from the atoms of its dim (``axes.AxisTable``): the sequence atom becomes the length the
copy is built for (a chunk's rows, or its keys for key-side values and key dims), every other
atom keeps its size, read from a tensor of the new graph that carries it when it is symbolic.
So a chunk graph reads its chunk length, its key length and its batch size from its inputs and
is compiled once for all of them.
"""
from __future__ import annotations

import operator

import sympy
import torch
import torch.fx as fx

from streamfx.errors import CannotStream
from .graphs import SIZE_ARG_OPS, is_tensor, same, val

aten = torch.ops.aten
# creation ops whose first argument is a length
LENGTH_ARG_OPS = {torch.ops.prims.iota.default: 0, aten.arange.default: 0}


def reads_size_as_value(x: fx.Node) -> bool:
    """Whether ``x`` reads a symbolic size other than as its shape or length argument (which a
    copy rebuilds: ``Sizes.patch``), as ``arange(n) / n`` does: the size is the whole sequence's,
    where a chunk graph would read its own."""
    pos = SIZE_ARG_OPS.get(x.target, LENGTH_ARG_OPS.get(x.target))
    arg = x.args[pos] if pos is not None and pos < len(x.args) else ()
    shape = {a for a in (arg if isinstance(arg, (list, tuple)) else [arg]) if isinstance(a, fx.Node)}
    return any(not is_tensor(val(a)) and a not in shape for a in x.all_input_nodes)


class Sizes:
    """Size arguments of one graph under construction.

    sd:       the axis analysis of the original (joint) graph
    size_of:  size_of(key) -> an int or a node of the new graph: key "q" or "k" for the length of
              the sequence as rows or as keys, or a shape symbol (sympy) of the joint graph
    keep_symbolic: sizes off the sequence stay as they are (a copy inside the same graph)
    readable: readable(expr) -> whether size_of(expr) can be asked for a compound size expression
    """

    def __init__(self, sd, size_of, keep_symbolic: bool = False, readable=None):
        self.sd, self.size_of = sd, size_of
        self.keep_symbolic = keep_symbolic
        self.readable = readable or (lambda expr: False)

    def patch(self, new: fx.Node, old: fx.Node, key_side: bool = False) -> None:
        """Rewrite the size argument of ``new`` (a copy of ``old``) for the new graph."""
        pos = SIZE_ARG_OPS.get(old.target)
        if pos is not None and is_tensor(val(old)) and pos < len(new.args):
            roles = self._roles(old, key_side)
            sizes = list(new.args[pos])
            with new.graph.inserting_before(new):
                for k, entry in enumerate(sizes):
                    if not (isinstance(entry, int) and entry == -1) and k < len(roles):
                        sizes[k] = self.dim(old, k, roles[k], val(old).shape[k], entry)
            args = list(new.args)
            args[pos] = sizes
            new.args = tuple(args)
        elif old.target in LENGTH_ARG_OPS and is_tensor(val(old)):
            roles = self._roles(old, key_side)
            with new.graph.inserting_before(new):
                length = self.dim(old, 0, roles[0], val(old).shape[0], new.args[0])
            new.args = (length,) + tuple(new.args[1:])
        foreign = [x for x in new.all_input_nodes if x.graph is not new.graph]
        if foreign:
            raise CannotStream("a symbolic size is used as a value inside the region", old)

    def _roles(self, old, key_side):
        roles = self.sd.roles(old)
        return tuple("k" if r else None for r in roles) if key_side else roles

    def dim(self, old: fx.Node, k: int, role, full, entry):
        """The new size of dim ``k`` of ``old``'s value; ``full`` is its size in the joint graph."""
        atoms = self.sd.table.canon(self.sd.axes[old][0][k])
        if not role and (isinstance(entry, int) or self.keep_symbolic):
            return entry  # a size off the sequence
        if not atoms:
            if not same(full, 1):
                raise CannotStream(f"size {full} of dim {k} has no axis to rebuild it from", old)
            return 1
        whole, parts = 1, []
        for a in atoms:
            size = self.sd.table.size[a]
            whole = whole * size
            if a in self.sd.seq_atoms:
                parts.append(self.size_of(role or "q"))
            else:
                parts.append(size if isinstance(size, int) else self.atom_size(size.node.expr))
        if not same(whole, full) and not _same_assuming(whole, full, self.sd.table.assumed):
            raise CannotStream(f"size {full} of dim {k} does not match its axes ({whole})", old)
        return _multiply(parts)

    def atom_size(self, expr):
        """The size of one axis: a symbol, or an expression of symbols (a batch concatenated
        from two inputs, B0 + B1) read whole where an input of the new graph has it as a dim
        (``readable``), else computed from its symbols."""
        if not expr.is_Symbol and self.readable(expr):
            return self.size_of(expr)
        return self.expression(expr)

    def expression(self, expr):
        """A node computing a sympy expression of shape symbols (sums and products)."""
        if expr.is_Integer:
            return int(expr)
        if expr.is_Symbol:
            return self.size_of(expr)
        parts = [self.expression(a) for a in expr.args]
        if expr.is_Mul:
            return _multiply(parts)
        if expr.is_Add:
            total = parts[0]
            for p in parts[1:]:
                total = total + p if isinstance(total, int) and isinstance(p, int) else \
                    _graph_of(total, p).call_function(operator.add, (total, p))
            return total
        raise CannotStream(f"a size {expr} the region cannot rebuild")


def _same_assuming(a, b, assumed) -> bool:
    """Whether sizes ``a`` and ``b`` are equal given the table's assumed equalities (symbols
    replaced by the sizes they were equated with)."""
    if not assumed or isinstance(a, int) and isinstance(b, int):
        return False
    ea = sympy.sympify(a.node.expr if isinstance(a, torch.SymInt) else a)
    eb = sympy.sympify(b.node.expr if isinstance(b, torch.SymInt) else b)
    for p, q in assumed:
        p, q = (x.node.expr if isinstance(x, torch.SymInt) else sympy.sympify(x) for x in (p, q))
        for sym, value in ((p, q), (q, p)):
            if sym.is_Symbol:
                ea, eb = ea.subs(sym, value), eb.subs(sym, value)
                break
    return sympy.simplify(ea - eb) == 0


def _graph_of(*values):
    return next(v.graph for v in values if isinstance(v, fx.Node))


def _multiply(parts):
    """The product of ints and nodes (emitted at the graph's insertion point); an int if all are."""
    factor, result = 1, None
    for p in parts:
        if isinstance(p, int):
            factor *= p
        else:
            result = p if result is None else p.graph.call_function(operator.mul, (result, p))
    if result is None:
        return factor
    return result if factor == 1 else result.graph.call_function(operator.mul, (result, factor))
