"""Small graph helpers every pass uses: walks, order, the joint's placeholders, sizes.

Sizes may be symbolic (``torch.SymInt``). Comparisons here never add a guard to the shape
environment: a guard would specialise the compiled graph to one length, and Dynamo would then
recompile for every new length. Two sizes are "the same" only when that is known for every
value of their symbols (``statically_known_true``), never because their current values agree.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from .compat import size_hint
from .stops import STOP

aten = torch.ops.aten

# the matmuls an LM head's projection is traced as
PROJECTIONS = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default)

# ops that return their input as it is (a view of all of it, or a copy)
ALIASES = frozenset({aten.alias.default, aten.detach.default, STOP})
COPIES = frozenset({aten.clone.default, aten.alias.default, STOP})
# reshapes that keep a per-token value per token when its sequence dim stays whole
SEQ_VIEWS = frozenset({aten.view.default, aten._unsafe_view.default, aten.reshape.default})
# ops with a size list argument, and its position
SIZE_ARG_OPS = {aten.view.default: 1, aten._unsafe_view.default: 1, aten.reshape.default: 1,
                aten.expand.default: 1, aten.full.default: 0, aten.zeros.default: 0,
                aten.ones.default: 0, aten.empty.memory_format: 0, aten.new_zeros.default: 1,
                aten.new_ones.default: 1, aten.new_empty.default: 1, aten.new_full.default: 1}


def written_input(node: fx.Node):
    """The graph input an in-place op writes (``copy_(primal, new)``: a buffer updated in the
    forward, kept in the graph by AOTAutograd), or None."""
    schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
    if schema is None or not schema.is_mutable:
        return None
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write and i < len(node.args) \
                and isinstance(node.args[i], fx.Node) and node.args[i].op == "placeholder":
            return node.args[i]
    return None


# ---- walks ------------------------------------------------------------------------------------
def ancestors(targets, within=None) -> set:
    """Nodes the ``targets`` are computed from, the targets included; with ``within``, the walk
    stays inside that set (and targets outside it are dropped)."""
    stack = [t for t in targets if within is None or t in within]
    seen: set = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(x for x in n.all_input_nodes if within is None or x in within)
    return seen


def in_order(nodes, graph: fx.Graph | None = None) -> list:
    """``nodes`` sorted in graph order."""
    nodes = list(nodes)
    if not nodes:
        return []
    rank = order(graph if graph is not None else nodes[0].graph)
    return sorted(nodes, key=rank.__getitem__)


def order(graph_or_nodes) -> dict:
    """Position of every node of a graph (or of a node list)."""
    nodes = graph_or_nodes.nodes if isinstance(graph_or_nodes, fx.Graph) else graph_or_nodes
    return {n: i for i, n in enumerate(nodes)}


# ---- the joint graph's placeholders ---------------------------------------------------------------
def primals(graph: fx.Graph) -> list:
    return [n for n in graph.find_nodes(op="placeholder") if n.name.startswith("primals")]


def tangents(graph: fx.Graph) -> list:
    return [n for n in graph.find_nodes(op="placeholder") if n.name.startswith("tangents")]


def is_tangent(node: fx.Node) -> bool:
    return node.op == "placeholder" and node.name.startswith("tangents")


def outputs(graph: fx.Graph) -> list:
    return list(graph.find_nodes(op="output")[0].args[0])


# ---- values -----------------------------------------------------------------------------------
def val(node):
    """The fake value recorded on a node (a tensor, a tuple of them, a SymInt...), or None."""
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def is_tensor(v) -> bool:
    return isinstance(v, torch.Tensor)


def tensor_vals(node) -> list:
    """The node's outputs as a list (one entry per output; non-tensors kept as they are)."""
    v = val(node)
    return list(v) if isinstance(v, (tuple, list)) else [v]


def node_inputs(node: fx.Node) -> list[fx.Node]:
    """Tensor-valued input nodes, flattened from args and kwargs, in order."""
    out: list[fx.Node] = []
    fx.node.map_arg((node.args, node.kwargs), lambda x: out.append(x) if is_tensor(val(x)) else None)
    return out


def made_from_sizes(node: fx.Node) -> bool:
    """Whether ``node`` is an op call with no tensor input (``arange``, ``empty``, ``full``: made
    from sizes alone); an item of a multi-output op's result is not."""
    return node.op == "call_function" and node.target is not operator.getitem and not node_inputs(node)


def bind(node: fx.Node) -> dict:
    """Arguments of an OpOverload call by schema name (defaults filled in)."""
    out = {}
    for i, a in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def normalize_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def unpadded(node):
    """``x`` where ``node`` is ``slice(constant_pad_nd(x, [0, p]), -1, 0, size(x, -1))``: a pad of the
    last dim taken back off (how the efficient attention kernel's composite aligns its mask rows),
    whose values are ``x``'s; else None."""
    if not (isinstance(node, fx.Node) and node.target is torch.ops.aten.slice.Tensor and len(node.args) >= 4):
        return None
    pad = node.args[0]
    if not (isinstance(pad, fx.Node) and pad.target is torch.ops.aten.constant_pad_nd.default):
        return None
    x, pads = pad.args[0], list(pad.args[1])
    ndim = len(val(x).shape)
    if node.args[1] not in (-1, ndim - 1) or len(pads) != 2 or pads[0] != 0 or node.args[2] != 0:
        return None
    return x if same(val(node).shape[-1], val(x).shape[-1]) else None


# ---- sizes ------------------------------------------------------------------------------------
def same(a, b) -> bool:
    """True when two sizes are equal for every value of their symbols (adds no guard)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    try:
        return bool(statically_known_true(a == b))
    except Exception:  # unbacked or undecidable
        return False


def less(a, b) -> bool:
    """True when ``a < b`` for every value of their symbols (adds no guard)."""
    if isinstance(a, int) and isinstance(b, int):
        return a < b
    try:
        return bool(statically_known_true(a < b))
    except Exception:
        return False


def is_one(s) -> bool:
    return same(s, 1)


def hint(s) -> int:
    """A size's value for this compile (a policy input, never a guard): ints as they are,
    symbols by their hint."""
    return size_hint(s, fallback=1)


def per_token(node: fx.Node, sd, nbytes: bool = False):
    """Values (or bytes) per token of a node's value: the product of its dims other than the
    sequence dim (symbolic ones by their hint); inf without a sequence dim."""
    v = val(node)
    d = sd.seq_dim(node) if is_tensor(v) else None
    if d is None:
        return float("inf")
    count = 1
    for k, s in enumerate(v.shape):
        if k != d:
            count *= hint(s)
    return count * (v.element_size() if nbytes else 1)


def wider(node: fx.Node, sd, floor) -> bool:
    """Whether a per-token value is wider per token than ``floor`` (the hidden state a head starts
    from, ``per_token`` of it): what a head streams to keep from existing whole."""
    return floor < per_token(node, sd) < float("inf")
