"""Value provenance: region inputs whose values are positions of the region's own rows.

Slicing a region input per chunk is right for per-token data and wrong for a tensor whose VALUES
are positions of rows the region computes: a chunk's tensors hold its rows at 0..c-1, while
positions over the whole sequence run to T-1 (an ``arange`` over a mixture-of-experts dispatch's
flattened token-expert pairs, made into its inverse permutation; a sort's indices, a ``nonzero``
or a ``cumsum`` of a mask computed before the layer). Which inputs hold such positions is read
from where their values go: into an index along a dim that holds the sequence, of a tensor the
region computes, directly or through ops that pass positions on (``POSITION_PASSES``). Never
from sizes: with batch 1 and one expert per token, a dispatch's flat dim has exactly T elements
and the same axis as the tokens, and only the values tell positions from per-token data.

Such an input is made per chunk when it is made from sizes alone (``arange``, ``iota``: at the
chunk's length it holds the chunk's positions) and read nowhere as anything but positions;
otherwise the region is refused with that cause.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from streamfx.errors import CannotStream, op_name, source_line

from .graphs import in_order, made_from_sizes
from .rules import UNIFORM_CREATION, VALUE_COPIES

aten = torch.ops.aten


def _indexed(node):
    """(data, dim, index) of each index tensor of an advanced index ``x[..., i, ...]``."""
    return [(node.args[0], d, i) for d, i in enumerate(node.args[1]) if isinstance(i, fx.Node)]


def _dim_index(node):
    """(data, dim, index) of ``index_select`` / ``gather`` / ``scatter`` (index the third argument)."""
    return [(node.args[0], node.args[1], node.args[2])] if isinstance(node.args[2], fx.Node) else []


# op -> the (data, dim, index) triples it reads rows by: the index's values are positions along
# that dim of the data
INDEX_READS = {aten.index.Tensor: _indexed, aten.index_put.default: _indexed, aten._unsafe_index.Tensor: _indexed,
               aten.index_select.default: _dim_index, aten.gather.default: _dim_index,
               aten.scatter.src: _dim_index, aten.scatter.value: _dim_index, aten.scatter_add.default: _dim_index}


def _floor_div(node) -> tuple:
    return (0,) if node.kwargs.get("rounding_mode") == "floor" and isinstance(node.args[1], int) else ()


# op -> the arguments whose values are positions when the output's are (positions in, positions
# out: a copy, ``perm // top_k``, ``inv[perm] = arange``, a gather of positions)
POSITION_PASSES = {**{op: lambda node: (0,) for op in VALUE_COPIES},
                   aten.div.Tensor_mode: _floor_div,
                   aten.index_put.default: lambda node: (2,),
                   aten.index.Tensor: lambda node: (0,)}


def index_reads(node) -> list:
    rule = INDEX_READS.get(node.target) if node.op == "call_function" else None
    return rule(node) if rule is not None else []


def position_args(node) -> tuple:
    rule = POSITION_PASSES.get(node.target) if node.op == "call_function" else None
    return rule(node) if rule is not None else ()


def position_inputs(region_nodes, sd) -> dict:
    """Inputs of the region (nodes outside ``region_nodes``) whose values reach, through position
    passes inside it, an index along a sequence dim of a tensor the region computes; each with
    the index op that reads it."""
    inside, found = set(region_nodes), {}
    for n in region_nodes:
        for x, d, i in index_reads(n):
            axes = (sd.axes.get(x) or [None])[0]
            if x not in inside or axes is None or not sd.has_seq(axes[d]):
                continue
            stack, seen = [i], set()
            while stack:
                m = stack.pop()
                if not isinstance(m, fx.Node) or m in seen:
                    continue
                seen.add(m)
                if m not in inside:
                    found.setdefault(m, n)
                    continue
                stack += [m.args[k] for k in position_args(m)]
    return found


def _only_positions(x, inside) -> bool:
    """Every use of ``x`` inside the region reads it as positions: as an index, or through a
    position pass whose result is read only as positions."""
    for u in x.users:
        if u not in inside:
            continue
        if any(i is x for _, _, i in index_reads(u)):
            continue
        if any(u.args[k] is x for k in position_args(u)) and _only_positions(u, inside):
            continue
        return False
    return True


def remade_per_chunk(x, inside) -> bool:
    """Whether ``x``, a tensor made from sizes alone whose sequence dim merges other dims (a flat
    ``[B*T]``, which a chunk cannot read as one slice of it), can be made again inside the region
    at a chunk's sizes: its elements hold one value (``UNIFORM_CREATION``), or positions read only
    as positions (a mixture-of-experts dispatch's ``inv[perm] = arange``: a chunk's own rows).
    Positions read as data (a flat token index as a loss weight) hold, at each token, where it
    sits in the whole sequence: a chunk made again would number its own rows from 0, so such a
    tensor stays an input, read per chunk as rows of the flat dim."""
    return x.target in UNIFORM_CREATION or _only_positions(x, inside)


def rebuild_positions(region_nodes, nodes, inputs, sd):
    """(nodes, inputs) with each input that holds positions of the region's rows made per chunk
    (made from sizes alone, with a sequence dim, read only as positions); raises CannotStream
    for any other such input."""
    inside = set(region_nodes)
    made = []
    for x, reader in position_inputs(region_nodes, sd).items():
        if x not in inputs:
            continue  # made per chunk already (a flat arange over merged dims)
        if made_from_sizes(x) and sd.seq_dim(x) is not None and "k" not in sd.roles(x) and _only_positions(x, inside):
            made.append(x)
            continue
        raise CannotStream("positions along the sequence computed outside the layer index rows the layer "
                           "computes (a chunk holds its own rows from 0: the whole sequence's positions would "
                           f"point outside it), read as an index by {op_name(reader)}{source_line(reader)}", x)
    if not made:
        return nodes, inputs
    return in_order(list(nodes) + made), [x for x in inputs if x not in made]
