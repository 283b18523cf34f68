"""Where a layer's K/V graph ends: the tensors it keeps for the whole sequence.

The K/V graph runs per chunk of rows and writes its outputs into full-length buffers; the query
graph reads a prefix of those buffers and computes the rest of the keys and values from it (the
"key side"). Two boundaries are considered:

- the keys and values themselves, walked back through views and copies (``kv_boundary``), and
- the narrowest set of tensors every sequence-carrying path into the keys and values crosses
  (``latent_cut``): a vertex cut of the K/V producers, weighted by values per token. Multi-head
  latent attention (DeepSeek MLA) has its keys and values up-projected per head from a compressed
  per-token latent plus one decoupled rotary key: the cut is that latent and that rotary key,
  and each chunk up-projects the prefix it reads.

Which one a layer keeps (option ``kv_boundary``): "heads", the keys and values; "latent", the
cut wherever it is narrower; "auto", the cut where it holds fewer bytes through the layer's
backward (``kept_bytes``). The cut's buffers are narrow, but attention still needs every head's
keys and values of the prefix inside each chunk, so the longest chunk builds them (and their
gradients) from the cut: in fp32 on CPU that is as much as the plain boundary's buffers and
fp32 accumulators, and the recompute of the key side over each chunk's prefix (for MLA, the
up-projection: about ``latent width / chunk size`` of the attention's own multiply-adds) costs
time. The estimate favours the cut for bf16 keys and values assembled without extra copies
(DeepSeek-V3's shapes: 128 heads from a 512-wide latent).
"""
from __future__ import annotations

import operator

import networkx as nx
import torch
import torch.fx as fx

from .graphs import ancestors, order, per_token
from .rules import is_pointwise

aten = torch.ops.aten

# tensors made from a size alone, the same at every position: rebuilt on the key side at the
# prefix's length (a source of the cut would be a position-dependent one, such as ``arange``)
FILLS = {aten.empty.memory_format, aten.empty_strided.default, aten.zeros.default, aten.ones.default,
         aten.full.default, aten.new_empty.default, aten.new_zeros.default, aten.new_ones.default,
         aten.new_full.default}

# ops whose result shares its input's memory (nothing new per chunk)
VIEWS = {aten.view.default, aten._unsafe_view.default, aten.unsqueeze.default, aten.squeeze.dim,
         aten.squeeze.dims, aten.expand.default, aten.permute.default, aten.transpose.int, aten.t.default,
         aten.slice.Tensor, aten.select.int, aten.narrow.default, aten.split.Tensor,
         aten.split_with_sizes.default, aten.alias.default, aten.detach.default, operator.getitem}

KV_VIEW_OPS = {aten.unsqueeze.default, aten.expand.default, aten.clone.default, aten.view.default,
               aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
               aten.transpose.int, aten.alias.default}


def kv_boundary(node, inside: set, sd, key_views: frozenset = frozenset(), convs=None):
    """Where the K/V graph stops for the attention's keys (or values) ``node``: walking back
    through views and copies (GQA's repeat_kv is unsqueeze, expand, clone, view), the narrowest
    tensor of the walk, the earliest of equal ones. The full-length K/V buffers, their fp32
    gradients and each chunk's prefix then hold only the distinct key/value heads; the query
    graph applies the rest of the walk per chunk (fused CPU attention skips the repeat).
    The walk passes a tensor only where every use of it inside the layer is on such a walk
    (``key_views``, see ``_view_walks``: two attention calls repeating one key tensor each).
    Returns (boundary, nodes after it up to ``node``: the key side of the query graph)."""
    walk, cur, passed = [node], node, {}
    while (x := _viewed(cur, inside, sd, convs)) is not None:
        conv = (convs or {}).get(cur)
        users = conv.nodes if conv is not None else {cur}
        if any(u not in users and u not in key_views for u in x.users if u in inside):
            break
        if conv is not None:
            passed[len(walk)] = conv.nodes
        walk.append(x)
        cur = x
    best = min(range(len(walk)), key=lambda i: (per_token(walk[i], sd), -i))
    after = frozenset(walk[:best]).union(*(nodes for i, nodes in passed.items() if i <= best))
    return walk[best], after


def _viewed(cur, inside: set, sd, convs=None):
    """The tensor ``cur`` is a view or copy of, where the walk of ``kv_boundary`` may go on to it;
    through a causal convolution (``convs``: its output -> its site), the tensor it convolves: keys
    convolved along the sequence are computed on the key side, from the prefix of that tensor."""
    conv = (convs or {}).get(cur)
    if conv is not None:
        x = conv.key
        return x if x in inside and sd.seq_dim(x) is not None and sd.seq_is_atomic(x) else None
    if cur.op != "call_function" or cur.target not in KV_VIEW_OPS:
        return None
    x = cur.args[0]
    if not isinstance(x, fx.Node) or x not in inside or sd.seq_dim(x) is None or not sd.seq_is_atomic(x):
        return None
    return x


def _view_walks(nodes, inside: set, sd, convs=None) -> frozenset:
    """Every tensor on a walk back from ``nodes`` through views and copies (and causal
    convolutions), whatever its other uses."""
    seen = set()
    for cur in nodes:
        while cur is not None and cur not in seen:
            seen.add(cur)
            cur = _viewed(cur, inside, sd, convs)
    return frozenset(seen)


def kv_outputs(sites, inside: set, inputs, outputs, sd, mode: str = "auto"):
    """The tensors the K/V graph produces for the attention ``sites`` of one layer (the keys and
    values of all of them, each tensor once), the key side (nodes the query graph computes from
    their prefix), whether those tensors are a latent cut, the causal convolutions only the K/V
    graph computes (``inner_convs``) and the terms per key it computes (``per_key_terms``, read
    by the mask check too). ``mode`` (the ``kv_boundary``
    option): "heads", the keys and values (``kv_boundary``); "latent", the latent cut where there
    is a narrower one; "auto", the cut where ``kept_bytes`` is lower."""
    convs = {site.output: site for site in sites if site.kind == "conv"}
    inner = inner_convs(sites, inside, sd)
    ends = [x for site in sites if not any(site is i for i in inner) for x in (site.key, site.value)]
    terms = tuple(per_key_terms(inside, inputs, sd))
    ends += [x for _, x in terms if x not in ends]
    views = _view_walks(ends, inside, sd, convs)
    walked = [kv_boundary(x, inside, sd, views, convs) for x in ends]
    base = tuple(dict.fromkeys(b for b, _ in walked))
    key_side = frozenset().union(*(chain for _, chain in walked))
    site_nodes = frozenset().union(*(site.nodes for site in sites))
    cut = None if mode == "heads" else latent_cut(base, inside, inputs, outputs, site_nodes | key_side, sd)
    if cut is None or (mode == "auto" and kept_bytes(*cut, sd) >= kept_bytes(base, frozenset(), sd)):
        return base, key_side, False, tuple(inner), terms
    nodes, after = cut
    return nodes, key_side | after, True, tuple(inner), terms


BROADCAST_OPS = {aten.expand.default, aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.where.self}


def _broadcasts(n) -> bool:
    """An op whose output lines its inputs' dims up from the right (``expand``, elementwise)."""
    return n.op == "call_function" and (n.target in BROADCAST_OPS or is_pointwise(n.target))


def per_key_terms(inside: set, inputs, sd) -> list:
    """(n, x): tensors ``x`` of one sequence dim the layer computes from its rows (a floating-point
    input with a sequence dim: the hidden states) that ``n`` broadcasts along the key dim of a
    [queries, keys] tensor: a bias or selection per key (Doge's dynamic mask, made from the values
    and added to every query's scores). A chunk reads them for its keys, [0, e), not its own rows:
    the K/V graph makes them, as it makes the keys."""
    rows = {x for x in inputs if sd.seq_dim(x) is not None and x.meta["val"].is_floating_point()}
    found = []
    for n in inside:
        roles = sd.roles(n) if _broadcasts(n) else ()
        if "k" not in roles:
            continue
        kd, nd = roles.index("k"), len(roles)
        for x in n.all_input_nodes:
            xr = sd.roles(x) if x in inside else ()
            if xr.count("q") == 1 and "k" not in xr and xr.index("q") + nd - len(xr) == kd \
                    and rows & ancestors([x], within=inside | rows):
                found.append((n, x))
    rank = order(next(iter(inside)).graph) if found else {}
    return sorted(found, key=lambda p: (rank[p[1]], rank[p[0]]))


def inner_convs(sites, inside: set, sd) -> list:
    """The causal convolutions (and token shifts) of a layer that only the K/V graph computes:
    each convolves the layer's rows on the way to the keys or values of its attention (a short
    convolution of the keys before the scores), and every path from its output meets the keys
    and values first (the queries, or the layer's output, would read it in the query graph, as
    Zaya's of queries and keys together). The K/V graph then runs per chunk of rows over the
    ``reach`` rows before them too (``LayerPlan.kv_reach``), and the convolution's input is not
    kept for the whole sequence."""
    convs = {site.output: site for site in sites if site.kind == "conv"}
    attention = [x for site in sites if site.kind != "conv" for x in (site.key, site.value)]
    if not convs or not attention:
        return []
    views = _view_walks(attention, inside, sd, convs)
    base = {kv_boundary(x, inside, sd, views, convs)[0] for x in attention}
    kv = ancestors(base, within=inside)

    def keys_only(out):   # (every path from it inside the layer meets the keys and values first)
        stack, seen = [out], set()
        while stack:
            n = stack.pop()
            if n in seen or n in base:
                continue
            if n not in kv:
                return False
            seen.add(n)
            stack.extend(u for u in n.users if u in inside)
        return True

    return [site for out, site in convs.items() if site.nodes <= kv and keys_only(out)]


def kept_bytes(boundary, after, sd) -> float:
    """Bytes per position one layer's backward holds for its keys when the K/V graph ends at
    ``boundary``: the full-length buffers and their fp32 gradient accumulators, plus what the
    longest chunk builds from its prefix: each tensor after the boundary that is not a view,
    with its gradient. At the plain boundary (``after`` empty) the chunk reads the buffers in
    place and only the prefix's gradient is new."""
    total = 0.0
    for x in dict.fromkeys(boundary):
        b = x.meta["val"].element_size()
        total += per_token(x, sd) * (b + 4) + (0 if after else per_token(x, sd) * b)
    for n in after:
        v = n.meta.get("val")
        if n.target in VIEWS or not isinstance(v, torch.Tensor) or sd.seq_dim(n) is None:
            continue
        total += 2 * per_token(n, sd) * v.element_size()
    return total


def latent_cut(base, inside: set, inputs, outputs, site_nodes, sd):
    """The narrowest vertex cut between the sequence-carrying sources of the K/V producers
    (layer inputs, tensors created in the layer) and the keys and values ``base``, the one
    nearest to them among equal ones; None where it is not narrower than ``base``.

    A tensor can be cut only where the query graph may read it as a key prefix: a plain
    sequence dim, not an output of the layer, every use inside the layer a K/V producer.
    A producer with a use outside the K/V producers (the normed hidden state that feeds the
    queries too) stays before the cut, with its ancestors. A tensor made from a size alone
    (``empty``, written by the key side) is rebuilt after the cut at the prefix's length, a
    layer input or not. Returns (cut tensors in graph order, the nodes after the cut up to
    ``base``, such inputs included)."""
    inputs, outputs = set(inputs), set(outputs)
    members = inside | inputs
    producers = {n for n in ancestors(base, within=members) if sd.seq_dim(n) is not None}
    if not producers:
        return None
    rank = order(next(iter(producers)).graph).__getitem__
    width = sum(per_token(b, sd) for b in dict.fromkeys(base))

    def users(n):
        return [u for u in n.users if u in inside]

    # made from sizes alone, or from such tensors alone (the same at every position), and read by
    # the K/V producers only (one copy of a node serves one length: the prefix's or the chunk's)
    fills = set()
    for n in sorted(producers, key=rank):
        tensors = [x for x in n.all_input_nodes if isinstance(x.meta.get("val"), torch.Tensor)]
        if n.op == "call_function" and (n.target in FILLS and not tensors
                                        or tensors and all(x in fills for x in tensors)) \
                and all(u in producers or u in site_nodes for u in users(n)):
            fills.add(n)

    def carries(x):
        return isinstance(x, fx.Node) and x in producers

    g = nx.DiGraph()
    S, T = "source", "sink"
    for n in producers:
        outside = [u for u in users(n) if u not in producers and u not in site_nodes]
        cuttable = (n not in outputs and not outside and sd.seq_is_atomic(n)
                    and per_token(n, sd) != float("inf") and set(sd.roles(n)) <= {"q", None}
                    and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_floating_point())
        if cuttable:
            g.add_edge((n, 0), (n, 1), capacity=per_token(n, sd))
        else:
            g.add_edge((n, 0), (n, 1))  # no capacity: never cut
        if outside:  # used by the query side: computed on the chunk's rows, before the cut
            g.add_edge(S, (n, 1))
        if n not in fills and (n in inputs or not any(carries(x) for x in n.all_input_nodes)):
            g.add_edge(S, (n, 0))
        for x in n.all_input_nodes:
            if carries(x):
                g.add_edge((x, 1), (n, 0))
    for b in base:
        g.add_edge((b, 1), T)
    try:  # (networkx's sink side: the nodes that reach the sink in the residual graph, so
        # the cut is the one nearest the keys and values among minimum ones)
        value, (_, near) = nx.minimum_cut(g, S, T)
    except (nx.NetworkXUnbounded, nx.NetworkXError):
        return None
    if not value < width:
        return None
    cut = [n for n in producers if (n, 1) in near and (n, 0) not in near]
    after = _descendants(cut, producers)
    for f in sorted(fills, key=rank, reverse=True):
        if any(u in after for u in f.users):
            after.add(f)
    # the cut property, checked: everything after the cut is computed from the cut alone
    for n in after:
        if any(carries(x) and x not in after and x not in cut for x in n.all_input_nodes):
            return None
    if not set(base) <= after | set(cut):
        return None
    return tuple(sorted(cut, key=rank)), frozenset(after)


def _descendants(roots, within) -> set:
    stack, seen = [u for r in roots for u in r.users if u in within], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(u for u in n.users if u in within)
    return seen


def returned_chain(node, boundary: tuple, key_side: frozenset):
    """(the K/V graph output ``node`` is computed from, the nodes from it to ``node``) where
    ``node`` is one of ``boundary`` (no nodes) or a view or copy of one on the key side (a KV
    cache stores the keys before a transpose the attention reads them through); None otherwise."""
    chain, cur = [], node
    while cur not in boundary:
        if cur not in key_side or cur.op != "call_function" or cur.target not in KV_VIEW_OPS \
                or not isinstance(cur.args[0], fx.Node):
            return None
        chain.append(cur)
        cur = cur.args[0]
    return cur, chain[::-1]
