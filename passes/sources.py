"""Where a graph's tokens come from: the sequence axis without attention, and the residual source.

A graph holding a whole model starts at the token embedding. A graph piece (a decoder layer
compiled alone, what follows a graph break, DDP's last split) starts at the residual stream
itself: a floating-point per-token graph input. Without an attention site the sequence axis is
the last axis of the token indices as the caller passes them ([B, T], as ``input_ids``; a
sequence-first model such as XLNet transposes them to [T, B] before its embedding): an
embedding's indices, else the loss's target (the labels).
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .graphs import COPIES, is_tensor, per_token, val

aten = torch.ops.aten
LOSS_OPS = (aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)


def seed_sequence(graph: fx.Graph, sd, picks=None) -> int | None:
    """The sequence atom of a graph without attention: the last axis of the token indices of an
    embedding, else of the target of a per-token loss (labels, shifted or not): ``nll_loss``'s
    target, or the index of the ``gather`` that picks each token's log-probability (a decomposed
    cross entropy). ``picks``: "loss" for the loss target's only."""
    for pick in ((_loss_target,) if picks == "loss" else (_embedding_indices, _loss_target)):
        for node in graph.nodes:
            dims = pick(node, sd) if node.op == "call_function" else None
            atoms = [a for d in dims or () for a in d]
            if atoms:
                return _unsliced(sd, sd.table.find(atoms[-1]), graph)
    return None


def _unsliced(sd, atom: int, graph: fx.Graph) -> int:
    """The axis a sequence slice ``atom`` was cut from (through slices of slices) that a
    floating-point per-token graph input lies on, where there is one; ``atom`` otherwise."""
    find = sd.table.find
    roots, frontier = [], [atom]
    while frontier:
        a = frontier.pop()
        srcs = [find(src) for out, src in sd.table.slices if find(out) == a and find(src) != a]
        frontier += [s for s in srcs if s not in roots]
        roots += srcs
    inputs = [n for n in graph.find_nodes(op="placeholder") if is_tensor(val(n)) and val(n).is_floating_point()]
    for root in roots:
        if any(find(x) == root for n in inputs for d in (sd.axes.get(n) or [()])[0] for x in d):
            return root
    return atom


LAYOUT_OPS = COPIES | {aten.permute.default, aten.transpose.int, aten.t.default, aten._to_copy.default}


def _embedding_indices(node, sd):
    if node.target is aten.embedding.default:
        indices = node.args[1]
        # back through transposes and copies to the indices as they entered the graph
        while isinstance(indices, fx.Node) and indices.op == "call_function" and indices.target in LAYOUT_OPS:
            indices = indices.args[0]
        return (sd.axes.get(indices) or [None])[0]
    return None


def _loss_target(node, sd):
    """Axes of the token dims of a loss target (the gathered dim of a gather left out)."""
    if node.target in LOSS_OPS:
        return (sd.axes.get(node.args[1]) or [None])[0]
    if node.target is aten.gather.default and val(node.args[0]).is_floating_point():
        axes = (sd.axes.get(node.args[2]) or [None])[0] or ()
        d = node.args[1] % len(axes) if axes else 0
        return tuple(a for k, a in enumerate(axes) if k != d)
    return None


def residual_sources(fwd_nodes, sd, requires_grad=frozenset()) -> list:
    """Where the residual stream may start, in the order to prefer them: the embeddings of the
    graph (the token embedding among them; a model may embed the tokens more than once, for a
    learned score per token or per-layer inputs, and ``regions.residual_chain`` keeps the one
    the layers' chain runs from), else the widest floating-point per-token graph input (the
    hidden state handed to a graph piece; rotary cos/sin are narrower), preferring one that gets
    a gradient. Empty when there is neither."""
    embeddings = [n for n in fwd_nodes if n.op == "call_function" and n.target is aten.embedding.default]
    if embeddings:   # (those along the sequence: an encoder-decoder's encoder embeds other tokens)
        return [n for n in embeddings if sd.seq_dim(n) is not None] or embeddings
    inputs = [n for n in fwd_nodes if n.op == "placeholder" and is_tensor(val(n)) and val(n).is_floating_point()
              and sd.seq_dim(n) is not None and sd.seq_is_atomic(n) and "k" not in sd.roles(n)]
    if not inputs:
        return []
    return [max(inputs, key=lambda n: (n in requires_grad, per_token(n, sd), -fwd_nodes.index(n)))]
