"""Where a layer's K/V graph ends: the keys and values it keeps for the whole sequence."""
from __future__ import annotations

import torch
import torch.fx as fx

from .graphs import per_token

aten = torch.ops.aten

KV_VIEW_OPS = {aten.unsqueeze.default, aten.expand.default, aten.clone.default, aten.view.default,
               aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
               aten.transpose.int, aten.alias.default}


def kv_boundary(node, inside: set, sd):
    """Where the K/V graph stops for the attention's keys (or values) ``node``: walking back
    through views and copies (GQA's repeat_kv is unsqueeze, expand, clone, view), the narrowest
    tensor of the walk, the earliest of equal ones. The full-length K/V buffers, their fp32
    gradients and each chunk's prefix then hold only the distinct key/value heads; the query
    graph applies the rest of the walk per chunk (fused CPU attention skips the repeat).
    Returns (boundary, nodes after it up to ``node``: the key side of the query graph)."""
    walk, cur = [node], node
    while cur.op == "call_function" and cur.target in KV_VIEW_OPS:
        x = cur.args[0]
        if not isinstance(x, fx.Node) or x not in inside or sd.seq_dim(x) is None or not sd.seq_is_atomic(x):
            break
        if [u for u in x.users if u in inside] != [cur]:
            break
        walk.append(x)
        cur = x
    best = min(range(len(walk)), key=lambda i: (per_token(walk[i], sd), -i))
    return walk[best], frozenset(walk[:best])
