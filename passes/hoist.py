"""Sequence slices moved in front of the head: ``lm_head(h)[:, :-1]`` becomes ``lm_head(h[:, :-1])``.

A shifted loss (TRL's ``logits[:, :-1]`` against ``labels[:, 1:]``) slices the logits along the
sequence. A slice maps rows [a, b) of one sequence axis onto another, so a head that contains
it cannot stream: the logits would exist for the whole sequence first. Every op between the
head's entry (the final hidden state) and such a slice is token-local, so the slice commutes
with them. This pass rebuilds that path on ``h[:, a:b]`` (sizes along the sequence scaled from
T to b - a; a slice of a slice becomes one slice) and routes the slice's users to it. The head
then starts at the sliced hidden state and streams along the sliced axis.

The pipeline applies it to a copy of the joint graph and keeps the copy only if the head then
streams; the copy's backward half still differentiates the old path, which the rewrite never
reads (it re-derives the backward from the forward).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode

from streamfx.errors import CannotStream
from .graphs import is_tensor, same
from .record import made_by
from .seq_dims import SEQ_FREE, TOKEN_LOCAL, UNKNOWN_MIXING, seq_slice
from .sizes import Sizes

aten = torch.ops.aten
STEP = "move_slices"


@dataclasses.dataclass(frozen=True)
class MovedSlice:
    slice: str        # the slice node that was replaced
    source: str       # the tensor it sliced (the logits)
    entry: str        # the tensor the new slice takes (the head's entry)
    start: int
    stop: int
    length: int       # length of the sequence axis that was sliced
    unsliced: fx.Node = None  # the whole-sequence tensor whose slice the head now computes itself

    def describe(self) -> str:
        return (f"{self.slice} ({self.source}[{self.start}:{self.stop}] of {self.length} tokens) "
                f"moved in front of the head: the head computes on {self.entry}[{self.start}:{self.stop}]")


def head_slices(analysis) -> list:
    """(slice, its head region) of the sequence slices inside the head regions that did not stream."""
    streamed = {p.name for p in analysis.plans}
    out = []
    for head in analysis.regions:
        if head.kind != "head" or head.name in streamed:
            continue
        inside = set(head.nodes)
        out += [(n, head) for n in head.nodes if analysis.classes.get(n) == UNKNOWN_MIXING
                and seq_slice(n, analysis.sd) is not None and n.args[0] in inside]
    return out


def copy_graph(graph: fx.Graph):
    """A copy of ``graph`` (output metadata included) and the old -> new node map."""
    new, val_map = fx.Graph(), {}
    value, old_out = new.graph_copy(graph, val_map, return_output_node=True)
    node = new.output(value)
    node.meta = dict(old_out.meta)
    return new, val_map


def move_one(graph: fx.Graph, analysis) -> MovedSlice | None:
    """Move the first head slice that can move; None when none can."""
    for s, head in head_slices(analysis):
        try:
            return move_slice(graph, s, head, analysis.sd, analysis.classes)
        except CannotStream:
            continue
    return None


def move_slice(graph: fx.Graph, s: fx.Node, head, sd, classes) -> MovedSlice:
    """Rebuild the token-local path from outside the head to slice ``s`` on sliced inputs."""
    d, a, b = seq_slice(s, sd)
    src = s.args[0]
    atom = sd.seq_axis(src)
    n = src.meta["val"].shape[d]
    length = s.meta["val"].shape[d]
    inside = set(head.nodes)
    mode = detect_fake_mode([x.meta.get("val") for x in graph.nodes if x.op == "placeholder"])
    memo: dict = {}
    entries = []
    lengths: dict = {}  # the sliced axis's length: set at the first entry
    symbols: dict = {}  # shape symbol -> the node read for it
    sizes = Sizes(sd, lambda key: lengths["q"] if isinstance(key, str) else _symbol_node(graph, key, s, symbols),
                  keep_symbolic=True)

    def carries(y) -> bool:
        """Whether input ``y`` has the sliced sequence axis (then it is sliced too)."""
        if not isinstance(y, fx.Node):
            return False
        v = y.meta.get("val")
        vals = v if isinstance(v, (tuple, list)) else [v]
        axes = {sd.seq_axis(y, i) for i, t in enumerate(vals) if is_tensor(t)} - {None}
        if not axes:
            return False  # (sizes and sequence-free values stay as they are)
        if axes != {atom}:
            raise CannotStream("the path to the slice mixes two sequence axes", y)
        return True

    def lift(x: fx.Node) -> fx.Node:
        if x in memo:
            return memo[x]
        if x in inside and x.op == "call_function" and classes.get(x) in (TOKEN_LOCAL, SEQ_FREE):
            new = graph.node_copy(x, lambda y: lift(y) if carries(y) else y)
            if new.target in (aten.view.default, aten._unsafe_view.default):
                new.target = aten.reshape.default  # the sliced rows are not contiguous
            sizes.patch(new, x)
        elif x in inside:
            raise CannotStream("an op on the path to the slice that is not token-local", x)
        else:
            new = _entry_slice(graph, x, sd, s)
            entries.append(x)
            if "q" not in lengths:  # from the graph's size inputs: outside the head, like Dynamo's sizes
                lengths["q"] = length if isinstance(length, int) else sizes.expression(length.node.expr)
        new.meta.pop("streamfx", None)
        made_by(new, STEP)
        new.meta["val"] = _fake_value(new, mode)
        _check_shape(new, x, sd, atom, n, length)
        memo[x] = new
        return new

    with graph.inserting_before(s):
        out = lift(src)
    if not all(same(p, q) for p, q in zip(out.meta["val"].shape, s.meta["val"].shape)):
        raise CannotStream("the moved slice does not give the slice's shape", s)
    s.replace_all_uses_with(out)
    graph.erase_node(s)
    entry = entries[0].name if len(entries) == 1 else ", ".join(e.name for e in entries)
    return MovedSlice(s.name, src.name, entry, a, b, n, unsliced=src)


def _symbol_node(graph, symbol, where, symbols: dict):
    """A node of the joint graph whose value is the shape symbol ``symbol``: a size input, else
    the size of an input tensor that has it as a dim (read once, after the inputs; ``symbols``
    keeps the nodes found for later requests)."""
    if symbol not in symbols:
        symbols[symbol] = _find_symbol(graph, symbol, where)
    return symbols[symbol]


def _find_symbol(graph, symbol, where):
    placeholders = list(graph.find_nodes(op="placeholder"))
    for p in placeholders:
        v = p.meta.get("val")
        if isinstance(v, torch.SymInt) and v.node.expr == symbol:
            return p
    for p in placeholders:
        v = p.meta.get("val")
        if is_tensor(v):
            for d, size in enumerate(v.shape):
                if isinstance(size, torch.SymInt) and size.node.expr == symbol:
                    with graph.inserting_after(placeholders[-1]):
                        node = graph.call_function(aten.sym_size.int, (p, d))
                    node.meta["val"] = size
                    return node
    raise CannotStream(f"the size {symbol} is not an input of the graph", where)


def _entry_slice(graph, x, sd, s):
    """``x`` sliced as slice ``s`` slices its sequence; a slice of a slice is one slice when
    both are static."""
    dx = sd.seq_dim(x)
    if not sd.seq_is_atomic(x):
        raise CannotStream("the slice would cut a dim that merges the sequence with another", x)
    args = tuple(s.args) + (None,) * 5
    start, end = args[2], args[3]
    inner = seq_slice(x, sd)
    if inner is not None and inner[0] == dx and all(isinstance(v, int) for v in (*inner[1:], *seq_slice(s, sd)[1:])):
        _, a0, _ = inner
        _, a, b = seq_slice(s, sd)
        new = graph.call_function(aten.slice.Tensor, (x.args[0], dx, a0 + a, a0 + b))
    else:
        new = graph.call_function(aten.slice.Tensor, (x, dx, start, end))
    new.meta = {k: v for k, v in x.meta.items() if k in ("stack_trace", "nn_module_stack")}
    return new


def _fake_value(node: fx.Node, mode):
    def value(y: fx.Node):
        if "val" not in y.meta:  # a size computed for the copy (its length, a product of sizes)
            y.meta["val"] = _run(y, value, mode)
        return y.meta["val"]

    try:
        return _run(node, value, mode)
    except Exception as e:  # noqa: BLE001 - an op that does not run on the sliced shapes
        raise CannotStream(f"the op does not run on the sliced sequence ({type(e).__name__}: {e})", node) from None


def _run(node: fx.Node, value, mode):
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), value)
    if mode is None:
        return node.target(*args, **kwargs)
    with mode:
        return node.target(*args, **kwargs)


def _check_shape(new: fx.Node, old: fx.Node, sd, atom, n, length) -> None:
    """Each output of the copy of op ``old`` has ``old``'s shape with the sequence dims scaled
    from ``n`` to ``length`` (compared as new * n == old * length: no division of symbols)."""
    if old.op != "call_function":
        return
    olds, news = old.meta.get("val"), new.meta.get("val")
    olds = list(olds) if isinstance(olds, (tuple, list)) else [olds]
    news = list(news) if isinstance(news, (tuple, list)) else [news]
    for i, (o, m) in enumerate(zip(olds, news)):
        if not is_tensor(o):
            continue
        axes = sd.axes[old][i]
        scaled = [any(sd.table.find(x) == atom for x in axes[k]) for k in range(o.dim())]
        if not is_tensor(m) or m.dim() != o.dim() or not all(
                same(p * n, q * length) if sc else same(p, q) for p, q, sc in zip(m.shape, o.shape, scaled)):
            raise CannotStream("the op does not keep its rows on the sliced sequence", old)
