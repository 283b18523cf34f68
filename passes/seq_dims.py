"""Sequence-dimension analysis: the role of each dim and the class of each node.

Pure: reads the graph and its fake-tensor metadata, returns a ``SeqDims`` result; the pipeline
stores it per node as ``node.meta["streamfx"]`` (see ``record.py``).

Roles: "q" (query sequence: the token a row belongs to), "k" (key sequence: the second sequence
dim of a token-by-token tensor such as attention scores or a mask), None.
Classes:
  token-local         output row t depends only on input rows t (pointwise, matmuls over features,
                      norms, views that keep the sequence dim)
  causal-mixing       part of a recognised causal attention site
  sequence-reduction  sums/contracts over the sequence (loss sums, weight-gradient contractions)
  sequence-free       no sequence dim in or out (parameters, scalars, sizes)
  unknown-mixing      combines different positions some other way (shift, cumsum, conv, sort...)
"""
from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx as fx

from . import verify
from .axes import AxisTable, RuleOut
from .graphs import is_tensor, node_inputs, same
from .rules import is_pointwise, pointwise, rule_for

TOKEN_LOCAL = "token-local"
CAUSAL_MIXING = "causal-mixing"
SEQ_REDUCTION = "sequence-reduction"
SEQ_FREE = "sequence-free"
UNKNOWN_MIXING = "unknown-mixing"
CLASSES = (TOKEN_LOCAL, CAUSAL_MIXING, SEQ_REDUCTION, SEQ_FREE, UNKNOWN_MIXING)


@dataclasses.dataclass
class SeqDims:
    table: AxisTable
    axes: dict            # node -> list of Axes (one per tensor output; None for non-tensors)
    reduced: dict         # node -> tuple of (input node, dim)
    mixed: dict           # node -> tuple of (input node, dim)
    unknown: set          # nodes without a rule that touch tensors
    seq_atom: int | None = None
    seq_atoms: frozenset = frozenset()

    def set_seq(self, atom: int | None) -> None:
        """Make ``atom`` the sequence axis. Static slices of it (``logits[:, :-1]``, a suffix
        ``hidden[:, -k:]``), and slices of those, are sequence axes too: their rows are tokens.
        The slice itself combines positions [a, b) of one axis into another (unknown-mixing),
        so only a region whose every per-token tensor is on one axis streams along it. A sort's
        permuted dim is a sequence axis too (the same tokens, reordered), and so is each group of
        it that a split by its groups' sizes makes (some of those tokens)."""
        self.seq_atom = None if atom is None else self.table.find(atom)
        atoms = set() if atom is None else {self.seq_atom}
        grown = True
        while grown:
            grown = False
            for out, src in self.table.slices + self.table.perm_pairs() + self.table.group_pairs():
                if self.table.find(src) in atoms and self.table.find(out) not in atoms:
                    atoms.add(self.table.find(out))
                    grown = True
        self.seq_atoms = frozenset(atoms)

    def has_seq(self, dim_axes) -> bool:
        return any(self.table.find(a) in self.seq_atoms for a in dim_axes)

    def seq_axis(self, node: fx.Node, out: int = 0) -> int | None:
        """The atom of the query-sequence dim of one output of ``node`` (None if it has none)."""
        d = self.seq_dim(node, out)
        if d is None:
            return None
        atoms = [self.table.find(a) for a in self.axes[node][out][d] if self.table.find(a) in self.seq_atoms]
        return atoms[0] if atoms else None

    def roles(self, node: fx.Node, out: int = 0) -> tuple:
        """Role of each dim of one output of ``node``: "q", "k" or None."""
        axes = (self.axes.get(node) or [None])[out]
        if axes is None:
            return ()
        roles = ["q" if self.has_seq(d) else None for d in axes]
        seq = [i for i, r in enumerate(roles) if r]
        if len(seq) >= 2:
            roles[seq[-1]] = "k"
        return tuple(roles)

    def seq_dim(self, node: fx.Node, out: int = 0) -> int | None:
        """Index of the query-sequence dim of one output of ``node`` (None if it has none)."""
        roles = self.roles(node, out)
        return roles.index("q") if "q" in roles else None

    def seq_is_atomic(self, node: fx.Node, out: int = 0) -> bool:
        """True if the sequence dim of ``node`` holds only the sequence (not merged with batch)."""
        d = self.seq_dim(node, out)
        return d is not None and len(self.axes[node][out][d]) == 1

    def touches_seq(self, pairs) -> bool:
        """Whether any (input, dim) pair is along the sequence; an input whose axes no rule gave
        (an output of a multi-output op the rules do not describe) counts as along it."""
        for x, d in pairs:
            outs = self.axes.get(x)
            if outs and (outs[0] is None or self.has_seq(outs[0][d])):
                return True
        return False

    def classify(self, node: fx.Node, attention_nodes=frozenset()) -> str:
        if node in attention_nodes:
            return CAUSAL_MIXING
        ins = [x for x in node_inputs(node) if self.axes.get(x)]
        any_seq_in = any(self.seq_dim(x) is not None for x in ins)
        if node in self.unknown and any_seq_in:
            return UNKNOWN_MIXING
        if self.touches_seq(self.mixed.get(node, ())):
            return UNKNOWN_MIXING
        if self.touches_seq(self.reduced.get(node, ())):
            return SEQ_REDUCTION
        outs = self.axes.get(node) or []
        if any(a is not None and any(self.has_seq(d) for d in a) for a in outs):
            return TOKEN_LOCAL
        return SEQ_FREE


def infer_axes(graph: fx.Graph) -> SeqDims:
    """Run the rule table over every node in order, unifying axes."""
    table = AxisTable()
    result = SeqDims(table, {}, {}, {}, set())

    def ax(x):
        axes = result.axes.get(x)
        if axes and axes[0] is not None:
            return axes[0]
        val = x.meta.get("val")
        return table.fresh_like(val.shape) if is_tensor(val) else ()

    for node in graph.nodes:
        val = node.meta.get("val")
        if node.op in ("placeholder", "get_attr"):
            result.axes[node] = [table.fresh_like(val.shape)] if is_tensor(val) else [None]
        elif node.op == "call_function" and node.target is operator.getitem:
            src, i = node.args
            src_axes = result.axes.get(src)
            result.axes[node] = [src_axes[i] if src_axes and i < len(src_axes) else None]
        elif node.op == "call_function":
            result.axes[node] = _apply_rule(node, table, ax, result)
    _check_permutations(table, result)
    if table.expand or table.runs:  # flat dims identified with products: every dim written in root atoms
        result.axes = {n: [None if a is None else tuple(table.canon(d) for d in a) for a in axes]
                       for n, axes in result.axes.items()}
    return result


def _check_permutations(table, result) -> None:
    """A sorted dim is the same tokens in another order only while it never meets the order it
    came from, nor another sort's order (an op that aligns them pairs different tokens): such a
    sort mixes positions along its dim."""
    roots = {}
    for node, (new, old) in table.perms.items():
        mine = set(table.canon(new))
        if mine & set(table.canon(old)) or any(mine & other for other in roots.values()):
            x = node.args[0]
            result.mixed[node] = tuple(result.mixed.get(node, ())) + ((x, _sorted_dim(node)),)
        roots[node] = mine


def _sorted_dim(node) -> int:
    d = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", -1)
    return d + node.args[0].meta["val"].dim() if d < 0 else d


def _apply_rule(node, table, ax, result) -> list:
    vals = node.meta.get("val")
    vals = list(vals) if isinstance(vals, (tuple, list)) else [vals]
    rule = rule_for(node.target)
    if rule is None and is_pointwise(node.target) and all(is_tensor(v) for v in vals[:1]):
        rule = pointwise
    if rule is None:
        ins = node_inputs(node)
        if ins:
            result.unknown.add(node)
        return [table.fresh_like(v.shape) if is_tensor(v) else None for v in vals]
    try:
        out: RuleOut = rule(node, table, ax)
    except Exception:  # a rule that cannot read this node's arguments: treat the op as unknown
        if verify.enabled():
            raise
        result.unknown.add(node)
        return [table.fresh_like(v.shape) if is_tensor(v) else None for v in vals]
    result.reduced[node] = tuple(out.reduced)
    result.mixed[node] = tuple(out.mixed)
    return [a if is_tensor(v) else None for a, v in zip(out.out, vals)]


def seq_slice(node: fx.Node, sd: SeqDims):
    """(dim, start, stop) of a step-1 slice that takes part of the sequence dim of its input
    (``logits[:, :-1]``, ``hidden[:, -k:]``; with a symbolic bound, a prefix or a suffix only);
    None for anything else. Start and stop are taken from the front of the sequence (ints, or
    SymInts when its length or the bound is a symbol)."""
    if node.op != "call_function" or node.target is not torch.ops.aten.slice.Tensor:
        return None
    x = node.args[0]
    v = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(v, torch.Tensor):
        return None
    args = list(node.args) + [None] * (5 - len(node.args))
    d = args[1] if args[1] is not None else node.kwargs.get("dim", 0)
    start = args[2] if args[2] is not None else node.kwargs.get("start")
    end = args[3] if args[3] is not None else node.kwargs.get("end")
    step = args[4] if args[4] is not None else node.kwargs.get("step", 1)
    d = d + v.dim() if d < 0 else d
    n = v.shape[d]
    if step != 1 or sd.seq_dim(x) != d or not sd.seq_is_atomic(x):
        return None
    if isinstance(start, fx.Node) or isinstance(end, fx.Node):
        # a symbolic bound (``hidden[:, -k:]`` with k a size Dynamo made dynamic): a suffix or a
        # prefix, read from the slice's own length
        out = node.meta.get("val")
        if not isinstance(out, torch.Tensor) or not all(
                b is None or isinstance(b, int) or isinstance(b.meta.get("val"), torch.SymInt) for b in (start, end)):
            return None
        length = out.shape[d]
        if end is None or (isinstance(end, int) and end >= (1 << 62)):
            return (None if same(length, n) else (d, n - length, n))
        if start is None or (isinstance(start, int) and start == 0):
            return (None if same(length, n) else (d, 0, length))
        return None
    if not all(isinstance(b, int) or b is None for b in (start, end)):
        return None
    static = isinstance(n, int)
    start = 0 if start is None else (start + n if start < 0 else (min(start, n) if static else start))
    end = n if end is None or (end >= (1 << 62)) else (end + n if end < 0 else (min(end, n) if static else end))
    if static and (start < 0 or end < 0):
        start, end = max(start, 0), max(end, 0)
    if same(start, 0) and same(end, n):
        return None
    if static and start >= end:
        return None
    return d, start, end
