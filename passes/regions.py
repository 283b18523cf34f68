"""Regions of the forward graph: layer regions cut at the residual stream, and the head region.

The residual stream is found with networkx: restrict the forward dataflow to the descendants
of its source (the token embedding, or the hidden-state input of a graph piece: see
``sources.residual_sources``), take the dominator chain of the loss (or of the last hidden-path
output) from the source; each chain node is a tensor every later activation is
computed from. A layer region runs from the chain node that feeds an attention site's queries
to the next such chain node; the sites whose queries follow from the same chain node (several
attention calls in one layer) are that layer's. The head region is everything from the last hidden chain node
(the narrowest one after the last attention site) to the sequence reductions that consume it;
without any (or where those do not stream), to the first values narrower than the hidden state
that the wider ones (the logits) are computed into (``_rows``: a map of rows).
"""
from __future__ import annotations

import dataclasses
import operator

import networkx as nx
import torch
import torch.fx as fx

from .graphs import COPIES, SEQ_VIEWS, is_tensor, made_from_sizes, order, per_token, val, wider
from .positions import remade_per_chunk
from .seq_dims import SEQ_FREE, SEQ_REDUCTION, TOKEN_LOCAL, seq_slice
from .sizes import reads_size_as_value
from .sources import residual_sources
from .units import projects

aten = torch.ops.aten


@dataclasses.dataclass
class Region:
    name: str                     # "layer.3" or "head"
    kind: str                     # "layer" | "head"
    entry: fx.Node                # the residual-stream tensor the region starts from
    nodes: list                   # forward nodes in graph order
    outputs: list                 # nodes used outside the region (or graph outputs)
    inputs: list                  # nodes from outside the region used inside it
    attention: list = dataclasses.field(default_factory=list)
    shared: frozenset = frozenset()  # cheap token-local side nodes recomputed inside the region
    # a head without a sum over the tokens: (values, leaves, selector) of ``_unreduced`` for the
    # refusal's cause; None otherwise
    unreduced: tuple | None = None
    # a head with sums over the tokens: the same head as a map of rows (``_rows``), planned where
    # its sums do not stream
    rows: "Region | None" = None

    def describe(self, names: bool = True) -> str:
        """The region; ``names``: graph node names (graph dumps), else its module (``explain()``)."""
        if not names:
            from streamfx.memory import in_module

            return (f"{self.name}{in_module(self.nodes)}: {len(self.nodes)} nodes, "
                    f"{len(self.inputs)} inputs, {len(self.outputs)} output(s)")
        return (f"{self.name}: {len(self.nodes)} nodes from {self.entry.name}, "
                f"{len(self.inputs)} inputs, outputs {[o.name for o in self.outputs]}")


def dataflow(nodes) -> nx.DiGraph:
    g = nx.DiGraph()
    keep = set(nodes)
    for n in nodes:
        g.add_node(n)
        for x in n.all_input_nodes:
            if x in keep:
                g.add_edge(x, n)
    return g


def residual_chain(fwd_nodes, sd, sinks, requires_grad=frozenset(), cut_sites=(), sites=()) -> list:
    """Dominator chain from the residual source to the sinks over the hidden path. For each site
    of ``cut_sites`` (attention sites), the edges into what that site's output computes from
    tensors computed without it are left out: tensors made before the site and read after it are
    then side inputs of its layer, not a path around the layers' outputs, which dominate the sinks
    again. Cut at the first site: tensors made from the source before the layers and read inside
    every layer (per-layer embeddings computed from the token embedding, Gemma 4's, read after
    each layer's attention). Cut at every site: per-token state one layer hands the next beside
    the residual stream (Zaya's router states, added into the next layer's router). ``sites``
    (the attention sites) choose among several sources: the one their queries are computed from."""
    sources = residual_sources(fwd_nodes, sd, requires_grad)
    if not sources or not sinks:
        return []
    g = dataflow(fwd_nodes)
    cut = []
    for site in cut_sites:
        if site.output in g:
            after = nx.descendants(g, site.output)   # (the site's own inputs still reach its output)
            cut += [(x, y) for x, y in g.edges if y in after and x not in after and x is not site.output]
    g.remove_edges_from(cut)
    rank = order(fwd_nodes)
    # of several sources (a model that embeds its tokens twice, once for a learned score that
    # selects keys or gates layers): the one the attention sites' queries are computed from, then
    # the one whose chain reaches furthest towards the sinks (ties, two embeddings added into one
    # stream: the first)
    best, key = [], None
    for src in sources:
        hidden = nx.descendants(g, src) | {src}
        chain = _chain_from(g, hidden, src, sd, sinks, rank)
        k = (sum(s.query in hidden for s in sites), rank[chain[-1]] if chain else -1)
        if key is None or k > key:
            best, key = chain, k
    return best


def _chain_from(g, hidden, emb, sd, sinks, rank) -> list:
    sub = g.subgraph(hidden).copy()
    ends = [s for s in sinks if s in hidden]
    if not ends:
        return []
    idom = nx.immediate_dominators(sub, emb)
    chains = [[c for c in _dominators(idom, s, emb) if sd.seq_dim(c) is not None] for s in ends]
    chains = [c for c in chains if c]  # (none with a sequence of one token)
    if not chains:
        return []
    # the chain that reaches furthest along the sequence path: a side output that branches off
    # inside a layer (MoE router logits, an auxiliary loss over them) does not end the residual
    # stream there. It holds every node that dominates all sinks.
    reach = max(rank[c[0]] for c in chains)
    chain = set.intersection(*(set(c) for c in chains if rank[c[0]] == reach))
    return sorted(chain, key=rank.__getitem__)


def _dominators(idom, node, root) -> list:
    """``node`` and the nodes that dominate it, up to ``root``."""
    chain = [node]
    while node != root:
        node = idom[node]
        chain.append(node)
    return chain


def find_regions(fwd_nodes, sd, sites, sinks, classes, requires_grad=frozenset()) -> list[Region]:
    chain = residual_chain(fwd_nodes, sd, sinks, requires_grad, sites=sites)
    if not chain:
        return []
    rank = order(fwd_nodes)
    g = dataflow(fwd_nodes)
    starts = _starts(chain, sites, g, rank)
    attns = sorted((s for s in sites if s.kind != "conv" and s.output in rank), key=lambda s: rank[s.output])
    # two layers start from one chain node: a side path reaches the later layers around the
    # earlier ones' outputs. First the chain without the paths from before the first attention
    # (per-layer inputs made from the source), then without those around every attention (state
    # handed from layer to layer beside the residual stream).
    whole = chain
    for cut in (attns[:1], attns):
        if not cut or len({id(s) for s, _ in starts}) == len(starts):
            break
        side = residual_chain(fwd_nodes, sd, sinks, requires_grad, cut_sites=cut, sites=sites)
        if side:   # (before the first attention, the chain as it was: the first layer starts at its input)
            first = rank[cut[0].output]
            side = [c for c in whole if rank[c] < first] + [c for c in side if rank[c] >= first]
            chain, starts = side, _starts(side, sites, g, rank)
    # (still one chain node for two layers: one layer of them all, whose attention calls read
    # each other's outputs, which the layer plan refuses with that cause)
    merged = []
    for start, layer_sites in starts:
        if merged and merged[-1][0] is start:
            merged[-1][1].extend(layer_sites)
        else:
            merged.append((start, layer_sites))
    starts = merged
    regions: list[Region] = []
    last_attn = max((rank[s.output] for s in sites if s.output in rank), default=-1)
    tail = [c for c in chain if rank[c] > last_attn]
    floor = per_token(starts[-1][0] if starts else chain[0], sd)
    head_entry = _head_entry(tail, sd, floor, fwd_nodes, rank) if tail else None
    layer_end = None
    if head_entry is not None:
        layer_end, head_entry = _through_slice(head_entry, g, sd, classes)
    bounds = [s for s, _ in starts] + ([layer_end] if layer_end is not None else [])
    for i, (start, layer_sites) in enumerate(starts):
        end = bounds[i + 1] if i + 1 < len(bounds) else None
        nodes = _between(fwd_nodes, g, start, end, rank)
        regions.append(_make_region(f"layer.{i}", "layer", start, nodes, layer_sites, rank, fwd_nodes))
    heads = _heads_on_runs(head_entry, g, sd, classes, fwd_nodes, floor, rank) \
        if head_entry is not None and layer_end is head_entry else None
    if heads:
        for k, (start, core, rows) in enumerate(heads):
            name = "head" if k == 0 else f"head.{k}"
            regions.append(_head_region(core, start, sd, classes, rank, fwd_nodes, name))
            if rows is not None:
                regions[-1].rows = _head_region(rows, start, sd, classes, rank, fwd_nodes, name)
        return regions
    reach = nx.descendants(g, head_entry) if head_entry is not None else set()
    red = [n for n in fwd_nodes if classes.get(n) == SEQ_REDUCTION and n in reach]
    wide = [n for n in fwd_nodes if n in reach and wider(n, sd, floor)]
    if head_entry is not None and reach and not red and not wide and chain[0].op != "placeholder":
        # nothing after the last layer is wider per token than the hidden state it starts from,
        # and nothing sums over the tokens: a pooled head (sequence classification, a value
        # read at the last token) whose loss reads selected tokens. There is nothing to stream.
        return regions
    rows = _rows(wide, g, classes, reach) if wide else None
    # a loss computed in the graph from the wide values that is not a sum over the tokens (a top-k
    # of the per-token losses): the logits it returns beside it follow the convention of a head
    # with a loss (dropped, or kept with return_logits); without one, they leave the graph for
    # the loss computed outside it, and exist whole
    loss = not red and any(s in g and sd.seq_dim(s) is None and _floating(s) and
                           any(nx.has_path(g, w, s) for w in wide) for s in sinks)
    if rows is not None and not red and not loss and any(w in sinks for w in wide):
        rows = None
    # a graph piece that starts at the residual stream and computes no loss has no head (a whole
    # model without a loss keeps its head region, which then refuses: no loss in the graph), but
    # where it computes per-token values narrower than the wider ones they come from (a map of
    # rows: log-probs returned); nor has a graph that ends at the head's entry (a model body whose
    # head and loss a later graph runs)
    if head_entry is not None and reach and (red or rows or chain[0].op != "placeholder"):
        core = _summed(red, g, reach) if red else rows or set()
        head = _head_region(core, head_entry, sd, classes, rank, fwd_nodes)
        if red and rows is not None:
            head.rows = _head_region(rows, head_entry, sd, classes, rank, fwd_nodes)
        if wide and not red and rows is None:
            # (what the refusal names: the values, whether they leave whole, what selects from them)
            head.unreduced = _unreduced(wide, g, sd, [] if loss else sinks)
        regions.append(head)
    return regions


def _summed(red, g, reach: set) -> set:
    """The sums over the tokens ``red`` and what they are computed from within ``reach``."""
    core = set(red)
    for r in red:
        core |= nx.ancestors(g, r) & reach
    return core


def _heads_on_runs(entry, g, sd, classes, fwd_nodes, floor, rank) -> list | None:
    """Heads over different runs of the hidden state's rows, where the losses
    read the hidden state through static slices along the sequence of different bounds (each a
    shifted loss's slice moved in front of its head: multi-token prediction's heads, each
    ``hidden[:, :-n]``; a distillation term over every token beside a next-token loss over
    ``hidden[:, :-1]``), each run of rows with its own sums, and no value computed from two runs
    (``logits[:, 1:] - logits[:, :-1]`` mixes tokens). ``start`` is a slice, or the hidden state
    itself for what reads it whole. Each is a head of its own, streamed along its run's axis,
    with its map of rows (``_rows``) where that stays within the run: [(start, nodes, rows)]. A
    run with no sum over its tokens and nothing wider than the hidden state (a pooled first
    token's classifier beside a shifted loss) is no head: it runs as it is.
    None where that is not the case (one run: the head of ``_through_slice``)."""
    slices = [u for u in entry.users if u in g and seq_slice(u, sd) is not None]
    direct = [u for u in entry.users if u in g and u not in slices]
    if not slices or len(slices) + bool(direct) < 2:
        return None
    runs = [(s, nx.descendants(g, s)) for s in slices]
    if direct:
        runs.append((entry, set().union(*(nx.descendants(g, u) | {u} for u in direct))))
    heads = []
    for i, (start, reach) in enumerate(runs):
        red = [n for n in fwd_nodes if classes.get(n) == SEQ_REDUCTION and n in reach]
        if not red:
            if any(wider(n, sd, floor) for n in reach):
                return None
            continue   # (a run read at no more than the hidden state's width, a pooled token: no head)
        core = _summed(red, g, reach)
        others = [other for j, (_, other) in enumerate(runs) if j != i]
        if any(core & other for other in others):
            return None
        wide = [n for n in fwd_nodes if n in reach and wider(n, sd, floor)]
        rows = _rows(wide, g, classes, reach) if wide else None
        heads.append((start, core, None if rows is None or any(rows & other for other in others) else rows))
    if not heads:
        return None
    return sorted(heads, key=lambda h: rank[h[0]] if h[0] is not entry else -1)


def _head_region(core: set, entry, sd, classes, rank, fwd_nodes, name: str = "head") -> Region:
    pulled = _pull_merged_inputs(set(core), sd, classes) - core
    nodes = [n for n in fwd_nodes if n in core or n in pulled]
    head = _make_region(name, "head", entry, nodes, [], rank, fwd_nodes)
    head.shared = frozenset(pulled)
    head.outputs = [o for o in head.outputs if o not in pulled]
    return head


def _rows(wide, g, classes, reach) -> set | None:
    """The head as a map of rows: the values wider per token than the hidden state (``wide``: the
    logits and what is computed from them at their width), what they are computed from after the
    head's entry, and every op that reads one, up to the first values no wider than the hidden
    state (per-token losses, log-probs, entropy). Each chunk writes its rows of those; whatever
    follows them (a mask's boolean index, a top-k or a maximum over the tokens, a reverse
    cumulative sum) reads them whole, at a width that costs no more than the hidden state. None
    where an op of it is neither row by row nor a sum over the tokens (``logits[:, -1]``). The
    head of a loss takes this form where its own sums do not stream (``plan.plan_head`` refuses
    them: a maximum over the tokens of the per-token losses); a head with no sum over the tokens
    always does."""
    core, todo = set(), list(wide)
    while todo:
        n = todo.pop()
        if n in core:
            continue
        core.add(n)   # (its inputs after the head's entry: every ancestor in reach, by closure)
        todo += [x for x in g.predecessors(n) if x in reach and x not in core]
        if n in wide:
            todo += [u for u in g.successors(n) if u not in core]
    if any(classes.get(n) not in (TOKEN_LOCAL, SEQ_FREE, SEQ_REDUCTION) for n in core):
        return None
    return core


# ops that read selected positions of a dim (an index, not a sum): the sequence dim gone after them
SELECTS = frozenset({aten.select.int, aten.index.Tensor, aten.index_select.default, aten.gather.default})


def _floating(node) -> bool:
    v = val(node)
    return is_tensor(v) and v.is_floating_point()


def _unreduced(wide, g, sd, sinks) -> tuple:
    """(values, leaves, selector) of a head without a sum over the tokens, for its refusal:
    ``leaves``, per-token values wider than the hidden state are graph outputs (``sinks``: those
    of a graph whose loss is computed outside it; the logits leave whole; the values are the
    widest of them); else ``selector``, where it is found, an op that
    reads selected tokens of wide values (``logits[:, -1]``), and the values those are (a
    projection's result where there is one); else the widest values, and no selector."""
    out = [o for o in sinks if o in g and o in wide]
    if out:
        return max(out, key=lambda n: per_token(n, sd)), True, None
    for n in wide:
        for sel in nx.descendants(g, n):
            if sel.op == "call_function" and sel.target in SELECTS and sd.seq_dim(sel) is None \
                    and isinstance(sel.args[0], fx.Node) and sd.seq_dim(sel.args[0]) is not None:
                values = [w for w in wide if w is sel.args[0] or nx.has_path(g, w, sel.args[0])]
                return next((w for w in values if projects(w)), values[0]), False, sel
    return max(wide, key=lambda n: per_token(n, sd)), False, None


def _starts(chain, sites, g, rank) -> list:
    """Layer boundaries: for each attention site, the last chain node that precedes its query;
    sites that start from one chain node, side by side (none computed from another's output),
    are one layer's (DiffLlama's two attention calls). [(chain node, [sites])]"""
    starts = []
    for site in sorted(sites, key=lambda s: rank.get(s.output, 0)):
        # (a causal convolution or token shift may read a chain node itself: the layer starts there)
        q = rank.get(site.query, -1) + (site.kind == "conv")
        before = [c for c in chain if rank[c] < q and nx.has_path(g, c, site.query)]
        if before and starts and starts[-1][0] is before[-1] and (site.kind == "conv" or not any(
                other.kind != "conv" and nx.has_path(g, other.output, x) for other in starts[-1][1]
                for x in (site.query, site.key, site.value) if x in g)):
            # (side by side: no attention of the layer feeds this one; a causal convolution is
            # part of the token mixing of the layer it is in, whichever site feeds it: a short
            # convolution of the queries, keys or values, or of an attention's output)
            starts[-1][1].append(site)
        elif before:
            starts.append((before[-1], [site]))
    return starts


def _pull_merged_inputs(nodes: set, sd, classes) -> set:
    """Pull in token-local producers of inputs whose sequence dim is merged with the batch
    (labels.view(-1)), so every input of the region can be sliced along a plain sequence dim; not a
    tensor made from sizes alone whose values a chunk would not make again (``remade_per_chunk``:
    a flat ``arange`` read as data stays an input, read per chunk as rows of its flat dim), nor one
    that reads a symbolic size as a value (``arange(n) / n``: the size is the whole sequence's)."""
    changed = True
    while changed:
        changed = False
        for n in list(nodes):
            for x in n.all_input_nodes:
                if x in nodes or x.op != "call_function" or classes.get(x) != TOKEN_LOCAL:
                    continue
                if (made_from_sizes(x) and not remade_per_chunk(x, nodes)) or reads_size_as_value(x):
                    continue
                if sd.seq_dim(x) is not None and not sd.seq_is_atomic(x):
                    nodes.add(x)
                    changed = True
    return nodes


def _projected(n: fx.Node) -> bool:
    """Whether ``n`` is a projection's result, or a reshape or copy of one (``mm`` then ``view``)."""
    while n.op == "call_function" and (n.target in SEQ_VIEWS or n.target in COPIES) and n.args \
            and isinstance(n.args[0], fx.Node):
        n = n.args[0]
    return projects(n)


def _head_entry(tail, sd, floor, fwd_nodes, rank):
    """The narrowest per-token chain node after the last attention site (the latest of equals)
    that is at least as wide as the residual stream (``floor``): the final hidden state, not a
    per-token loss computed from the logits. Logits that arrive as a graph input (no projection
    after them: the LM head ran outside the graph) are the entry themselves, so the softmax over
    the classes streams with the loss instead of running over the whole sequence before it."""
    tail = [n for n in tail if sd.seq_is_atomic(n)]  # a (B*T) merged dim is not sliced per token
    tail = [n for n in tail if per_token(n, sd) >= floor] or tail
    if not tail:
        return None
    best = min(per_token(n, sd) for n in tail)
    narrowest = [n for n in tail if per_token(n, sd) == best]
    # a projection's result as narrow as the hidden state (the logits of a vocabulary as wide as
    # it) comes after the head's entry: the entry is the latest of equals before it
    cut = next((i for i, n in enumerate(narrowest) if i and _projected(n)), None)
    narrowest = narrowest[:cut] if cut is not None else narrowest
    first = narrowest[0]
    if first.op == "placeholder" and not any(projects(n) for n in fwd_nodes if rank.get(n, -1) > rank[first]):
        return first
    return narrowest[-1]


def _through_slice(entry, g, sd, classes):
    """(end of the last layer, entry of the head). When the head computes on a static slice of
    the sequence (``hidden[:, :-1]``: a shifted loss, HF's ``logits_to_keep``), the last layer
    ends at the hidden state and the head starts at the slice, so each streams along its own
    sequence axis. The slice must be the head's only way to its sequence reductions."""
    base, sliced = entry, False
    # (the slice's consumer may be a view of it: with one row, hidden[:, :-1].view(-1, D) copies nothing)
    while base.op == "call_function" and (seq_slice(base, sd) is not None or base.target in COPIES
                                          or (base.target in SEQ_VIEWS and sd.seq_is_atomic(base))):
        sliced = sliced or seq_slice(base, sd) is not None
        base = base.args[0]
    if sliced:  # the slices and copies between the two are computed outside both regions
        return base, entry
    slices = [u for u in entry.users if u in g and seq_slice(u, sd) is not None]
    if len(slices) != 1:
        return entry, entry
    reductions = [n for n in nx.descendants(g, entry) if classes.get(n) == SEQ_REDUCTION]
    if not reductions:
        return entry, entry
    rest = g.copy()
    rest.remove_node(slices[0])
    if any(r in nx.descendants(rest, entry) for r in reductions):
        return entry, entry
    return entry, slices[0]


def _between(fwd_nodes, g, start, end, rank) -> list:
    reach = nx.descendants(g, start)
    stop = rank[end] if end is not None else None
    keep = [n for n in fwd_nodes if n in reach and (stop is None or rank[n] <= stop)]
    if end is not None:
        anc = nx.ancestors(g, end) | {end}
        keep = [n for n in keep if n in anc]
    return keep


def _make_region(name, kind, entry, nodes, sites, rank, fwd_nodes) -> Region:
    inside = set(nodes)
    fwd = set(fwd_nodes)
    # (an op of several outputs whose items are read past the region's end, a split whose second
    # item only a later layer reads: the region returns the items, tensors, not the op's list)
    items = [u for n in nodes if isinstance(n.meta.get("val"), (list, tuple)) for u in n.users
             if u.target is operator.getitem and u not in inside and u in fwd]
    if items:
        inside.update(items)
        nodes = sorted(inside, key=rank.__getitem__)
    inputs, seen = [], set()
    for n in nodes:
        for x in n.all_input_nodes:  # (symbolic sizes are rebuilt inside, not passed in)
            if x not in inside and x not in seen and not isinstance(x.meta.get("val"), (torch.SymInt, int)):
                seen.add(x)
                inputs.append(x)
    outputs = [n for n in nodes if any(u not in inside and (u in fwd or u.op == "output") for u in n.users)]
    return Region(name, kind, entry, nodes, outputs, sorted(inputs, key=lambda x: rank.get(x, -1)), sites)
