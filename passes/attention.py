"""Attention detection: fused SDPA ops on every device, and matmul-softmax-matmul attention.

A site records its query, key and value nodes, the nodes that belong to it and its mask node
(``masks.classify`` reads the mask's pattern). Fused ops are found by op; unfused attention is found structurally: a
matmul whose output has two sequence dims (scores, Q·Kᵀ), the nodes that keep both sequence
dims (scale, mask, softmax, dropout), and the matmul that contracts the key dim with V.
"""
from __future__ import annotations

import dataclasses
import math
import operator

import torch
import torch.fx as fx

from streamfx.errors import source_line

from . import kernels
from .axes import RuleOut
from .graphs import ancestors, bind, normalize_dim, same
from .rules import conv_step, is_pointwise, register, shape, token_shift

aten = torch.ops.aten

SDPA_OVERLOADS = kernels.FORWARD_OPS
SDPA_BACKWARD = kernels.BACKWARD_OPS


@register(*SDPA_OVERLOADS)
def sdpa(node, table, ax):
    q, k, v = node.args[:3]
    qa, ka, va = ax(q), ax(k), ax(v)
    table.unify(ka[-2], va[-2])
    for i in range(len(qa) - 2):
        if same(shape(q)[i], shape(k)[i]):
            table.unify(qa[i], ka[i])
    mask = _mask_of(node)
    if isinstance(mask, fx.Node):  # the mask is (..., queries, keys)
        ma = ax(mask)
        table.unify(ma[-2], qa[-2]) if ma[-2] else None
        table.unify(ma[-1], ka[-2]) if ma[-1] else None
    out = tuple(qa[:-1]) + (va[-1],)
    vals = node.meta["val"]
    n_out = len(vals) if isinstance(vals, (tuple, list)) else 1
    outs = [out] + [tuple(qa[: len(v_.shape)]) if isinstance(v_, torch.Tensor) else None
                    for v_ in (list(vals)[1:] if n_out > 1 else [])]
    # (causal: which keys a query sees depends on its position, so it combines positions along the
    # queries too; a causal self-attention is a site, which streams, ``find_sites``)
    causal = ((q, len(qa) - 2),) if bind(node).get("is_causal") else ()
    return RuleOut(outs, mixed=((k, len(ka) - 2), (v, len(va) - 2)) + causal)


def _mask_of(node):
    """The mask argument of a fused attention node (None where its kernel takes none)."""
    name = kernels.of(node).mask
    return bind(node).get(name) if name else None


@register(*SDPA_BACKWARD)
def sdpa_backward(node, table, ax):
    q, k, v = node.args[1:4]
    # a gradient of the mask (the efficient kernel's fourth output, where its mask needs one) is
    # per (query, key) as the mask is: the mask's axes
    name = kernels.BY_BACKWARD[node.target].mask
    mask = bind(node).get(name) if name else None
    extra = [ax(mask) if isinstance(g, torch.Tensor) and isinstance(mask, fx.Node) and _same_shape(g, mask) else None
             for g in list(node.meta["val"])[3:]]
    return RuleOut([ax(q), ax(k), ax(v)] + extra, reduced=((node.args[0], len(ax(q)) - 2),))


def _same_shape(t: torch.Tensor, node: fx.Node) -> bool:
    v = node.meta.get("val")
    return isinstance(v, torch.Tensor) and v.dim() == t.dim() and all(same(a, b) for a, b in zip(t.shape, v.shape))


@dataclasses.dataclass
class AttentionSite:
    index: int
    kind: str                       # "sdpa:<op>" or "matmul-softmax"
    query: fx.Node
    key: fx.Node
    value: fx.Node
    output: fx.Node
    nodes: frozenset
    is_causal: bool
    mask: fx.Node | None
    mask_kind: str = "none"          # the mask's pattern, see masks.classify
    window: int | None = None        # W of a sliding window (a query at t sees keys (t - W, t]), C of chunked attention
    data: tuple = ()                 # the data inputs the mask is computed from (read per call)
    scale: float | None = None
    mask_user: fx.Node | None = None   # the node that applies the mask to the scores (unfused)
    conflict: str | None = None        # why the scores' terms leave the keys a chunk reads unknown
    softmax: bool = True               # False: scores multiply the values with no softmax between
    # the ops that apply several mask terms to the scores in sequence (a ``where`` with a constant,
    # then an additive padding mask), in graph order, from the first to ``mask_user``: the mask the
    # analysis reads is their effect on zero scores, one additive mask per (query, key)
    mask_chain: tuple = ()
    dropout: object = None             # a fused kernel's dropout probability where it draws dropout inside
    mask_note: str | None = None       # why a mask that looks causal is not read as causal (masks.classify)
    seq_dim: int = -2                  # the sequence dim of ``query`` (and of ``key``)
    # the dims of the queries and the keys in the scores as the mask's op returns them (from the
    # end: [.., T, T] unless the queries sit elsewhere, grouped heads' ``[b, g, T, r, T]``)
    score_dims: tuple = (-2, -1)
    # a causal convolution (kind "conv"): output row t reads rows t - reach .. t of ``key``;
    # ``trim``: (output dim, first row) where the output is a slice of the convolution's rows
    reach: int | None = None
    trim: tuple | None = None

    @property
    def plain_causal_mask(self) -> bool:
        """A mask whose pattern is plain causal and read from no data: the chunk's fused kernel
        runs its own causal attention instead (``rewrite._chunk_attention``)."""
        return self.mask_kind == "causal" and not self.data

    @property
    def mask_checked_per_call(self) -> bool:
        """A fused causal site whose mask stays in the chunk graph (data, or too long to evaluate
        at compile time): each call checks it, and runs the causal kernel where it is exactly causal."""
        return self.kind.startswith("sdpa") and self.is_causal and self.mask is not None and not self.plain_causal_mask

    def describe(self, names: bool = True) -> str:
        """The site; ``names``: graph node names (graph dumps), else its module and the source
        lines of its mask data (``explain()``)."""
        def name(n):
            if names:
                return n.name
            return "a model input" if n.op == "placeholder" else (source_line(n).strip() or n.target.__name__)

        if self.kind == "conv":
            where = "" if names else f"{_module_or_line(self.output)} "
            if self.output.target is not aten.convolution.default and self.trim is None \
                    and token_shift(self.output) is not None:
                return f"#{self.index} token shift {where}(each row reads the row {self.reach} before it)"
            return f"#{self.index} causal convolution {where}(each row reads itself and the {self.reach} rows before it)"
        mask = self.mask_kind + (f"({self.window})" if self.window else "")
        if self.mask_chain:
            mask += f" (masks applied in sequence by {', '.join(map(name, self.mask_chain))}, read as one)"
        if self.data:
            mask += f", computed from data ({', '.join(dict.fromkeys(map(name, self.data)))}): keys per chunk read from it per call"
        if names:
            where = ""
        else:
            from streamfx.memory import module_path

            where = f"in {module_path(self.output) or source_line(self.output).strip()} "
        return f"#{self.index} {self.kind} {where}causal={self.is_causal} mask={mask}"


def find_sites(graph: fx.Graph, sd, forward: set) -> list[AttentionSite]:
    """Attention sites of the forward nodes, in order. ``sd`` is the axis result."""
    sites: list[AttentionSite] = []
    claimed: set = set()
    for node in graph.nodes:
        if node.op != "call_function" or node in claimed or node not in forward:
            continue
        if node.target in SDPA_OVERLOADS:
            b = bind(node)
            if not _keys_from_queries(b["query"], b["key"], b["value"], sd):
                continue   # (cross-attention: the queries' positions mix nothing; the rule ``sdpa`` says)
            mask = _mask_of(node)
            site = AttentionSite(len(sites), "sdpa:" + node.target._overloadpacket.__name__,
                                 b["query"], b["key"], b["value"], node, frozenset([node]),
                                 bool(b.get("is_causal", False)), mask, scale=b.get("scale"),
                                 dropout=kernels.dropout_of(node))
            sites.append(site)
        elif node.target in (aten.convolution.default, aten.cat.default, aten.constant_pad_nd.default):
            site = (conv_site if node.target is aten.convolution.default else shift_site)(node, sd, len(sites), forward)
            if site is not None:
                claimed |= site.nodes
                sites.append(site)
        elif node.target in SCORE_OPS and _self_similar(node, sd):
            site = _matmul_site(node, sd, len(sites), forward)
            if site is not None:
                claimed |= site.nodes
                sites.append(site)
    return sites


def _keys_from_queries(q: fx.Node, k: fx.Node, v: fx.Node, sd) -> bool:
    """Whether the keys or values are computed from a tensor along the queries' positions (self-
    attention, keys concatenated to other rows included); not where they come from other rows
    only (cross-attention to an encoder's or an image's states), whose attention mixes nothing
    along the queries: it is no site."""
    axes = (sd.axes.get(q) or [None])[0]
    if not axes or not axes[-2]:
        return True
    rows = {sd.table.find(a) for a in axes[-2]}
    for x in ancestors([k, v]):
        for out in sd.axes.get(x) or ():
            if out and any(sd.table.find(a) in rows for dim in out for a in dim):
                return True
    return False


def _module_or_line(node) -> str:
    """Where ``node`` is, as the user knows it: "in" its module, else its source line."""
    from streamfx.memory import module_path

    path = module_path(node)
    return f"in {path}" if path else source_line(node).strip()


def conv_site(conv: fx.Node, sd, index: int, forward: set):
    """A causal convolution along the sequence (LFM2's and Mamba's short convolutions): 1-D
    convolutions with stride 1 and left pads, in a chain that starts from a tensor ``x``, whose
    output rows line up with ``x``'s rows, directly or through the slice that drops its extra
    rows (``conv1d(x, padding=k - 1)[..., :T]``). Output row t then reads rows t - reach .. t of
    ``x`` only, and a chunk computes its rows from its own and the ``reach`` rows before them
    (the keys it reads). The geometry is computed from the ops' arguments: element j of a padded
    or convolved tensor belongs to row j - left of ``x``, and a convolution's output element reads
    the padded input's elements j .. j + (k - 1)·dil. None where the chain is not that."""
    chain, cur = [conv], conv
    while True:
        x = cur.args[0]
        if not isinstance(x, fx.Node) or x not in forward or x.op != "call_function" \
                or x.target not in (aten.convolution.default, aten.constant_pad_nd.default) \
                or any(u is not cur for u in x.users if u in forward):
            break
        chain.append(x)
        cur = x
    chain.reverse()
    x = chain[0].args[0]
    if not isinstance(x, fx.Node) or len(shape(x)) != 3:
        return None
    left = right = reach = 0
    for n in chain:
        if n.target is aten.constant_pad_nd.default:
            pads = list(n.args[1])
            if len(pads) != 2 or not all(isinstance(p, int) and p >= 0 for p in pads):
                return None
            left, right = left + pads[0], right + pads[1]
            continue
        step = conv_step(n)
        if step is None:
            return None
        left, right, reach = left + step[0] - step[1], right + step[0], reach + step[1]
        if left < 0:   # (an output row reads rows after its own, or the first rows are lost)
            return None
    out, trim = conv, None
    if (left, right) != (0, 0):
        users = [u for u in conv.users if u in forward]
        if len(users) != 1 or users[0].target is not aten.slice.Tensor:
            return None
        b = bind(users[0])
        if normalize_dim(b["dim"], 3) != 2 or b.get("step", 1) != 1 or (b.get("start") or 0) != left \
                or not same(shape(users[0])[2], shape(x)[2]):
            return None
        out, trim = users[0], (2, left)
    elif not same(shape(conv)[2], shape(x)[2]):
        return None
    return AttentionSite(index, "conv", x, x, x, out, frozenset(chain) | {out}, True, None, mask_kind="conv",
                         window=reach + 1, seq_dim=2, reach=reach, trim=trim)


def shift_site(node: fx.Node, sd, index: int, forward: set):
    """A token shift along the sequence (``rules.token_shift``: Zaya's delayed values, RWKV's
    time shift): row t of the output is row t - n of ``x``, a causal mixing of reach n that a
    chunk computes from its own rows and the n before them, as it does a causal convolution's
    (kind "conv"). None where the pattern is not that, or the sliced rows are read elsewhere too."""
    shifted = token_shift(node)
    if shifted is None:
        return None
    x, d, n = shifted
    nodes = {node}
    if node.target is aten.cat.default:
        part = node.args[0][1]
        if any(u is not node for u in part.users if u in forward):
            return None
        nodes.add(part)
    return AttentionSite(index, "conv", x, x, x, node, frozenset(nodes), True, None, mask_kind="conv",
                         window=n + 1, seq_dim=d, reach=n)


# Q·Kᵀ is a bmm, or a broadcast mul once Inductor's decomposition turns a head_dim-1 bmm into
# an outer product, or a baddbmm that adds a bias to it (Bloom's ALiBi: bias + alpha · Q·Kᵀ).
SCORE_OPS = (aten.bmm.default, aten.mm.default, aten.mul.Tensor, aten.baddbmm.default)


def _operands(node: fx.Node) -> tuple:
    """(queries, keysᵀ) of a score op."""
    return tuple(node.args[1:3]) if node.target is aten.baddbmm.default else tuple(node.args[:2])


def _holds(dim, seq: tuple, sd) -> bool:
    """Whether a dim indexes the axis ``seq`` (a canonical product of atoms): it is that axis, or
    that axis (one atom) merged with others, each of its entries one position of it (grouped
    heads' queries laid out as ``[.., heads x T, ..]`` or ``[.., T x heads, ..]`` by einsum)."""
    if not dim:
        return False
    atoms = sd.table.canon(dim)
    return atoms == seq or (len(seq) == 1 and atoms.count(seq[0]) == 1)


def _self_similar(node: fx.Node, sd) -> bool:
    """True if the last two dims of the output index one axis (query positions × key positions:
    the keys alone, the queries alone or merged with other axes, ``_holds``) and both operands
    are floating-point tensors carrying that axis (queries and keys)."""
    axes = sd.axes.get(node, [None])[0]
    if not axes or len(axes) < 2 or not axes[-1] or not axes[-2]:
        return False
    seq = sd.table.canon(axes[-1])
    if not _holds(axes[-2], seq, sd):
        return False
    operands = _operands(node)
    return all(isinstance(x, fx.Node) and x.meta["val"].is_floating_point()
               and any(_holds(d, seq, sd) for d in (sd.axes.get(x) or [()])[0])
               for x in operands)


def _sink_cat(node: fx.Node, scores: fx.Node, sd, seq) -> bool:
    """Attention sinks (gpt-oss): ``cat([scores, sink], -1)`` appends logits that are the same for
    every key (a learned per-head logit, no key axis) to the scores' key axis; the softmax then
    runs over keys and sinks, and a slice drops the sink columns before the product with V."""
    if node.target is not aten.cat.default or node.args[0][0] is not scores:
        return False
    ndim = len(node.meta["val"].shape)
    if (node.args[1] if len(node.args) > 1 else 0) not in (-1, ndim - 1):
        return False
    return all(not (sd.axes.get(x) or [None])[0] or not (sd.axes[x][0][-1])
               or sd.table.canon(sd.axes[x][0][-1]) != seq for x in node.args[0][1:])


def _matmul_site(scores: fx.Node, sd, index: int, forward: set):
    """Walk from Q·Kᵀ through the nodes that keep both sequence dims to the matmul with V."""
    # (the keys' axis; the queries lie along it too, alone or merged with other axes in a dim: ``_holds``)
    seq = sd.table.canon(sd.axes[scores][0][-1])
    keys = {seq}   # the scores' key axis, and the key axis extended by sink logits
    interior, frontier, out, mask = {scores}, [scores], None, None
    while frontier:
        n = frontier.pop()
        for user in n.users:
            if user in interior or user not in forward:
                continue
            if user.target in (aten.bmm.default, aten.mm.default) and user.args[0] in interior:
                out = user
                continue
            ua = (sd.axes.get(user) or [None])[0]
            if _sink_cat(user, n, sd, seq):
                keys.add(sd.table.canon(ua[-1]))
            # (the scores' two sequence dims: the keys last, the queries before them, but for
            # dims of one element after them (einsum's: ``[b, h, q, k, 1]`` between its products).
            # A row's value, [.., queries], ends in the sequence dim too, but holds no key dim: a
            # statistic over the keys, ``_key_statistics``, or a reduction no chunk computes)
            ua = _without_trailing_ones(ua, user)
            if ua and len(ua) >= 2 and ua[-1] and sd.table.canon(ua[-1]) in keys \
                    and any(_holds(d, seq, sd) for d in ua[:-1]):
                interior.add(user)
                frontier.append(user)
    if out is None:
        return None
    # softmax statistics (max and sum over the keys) leave the two-sequence-dim shape and come back,
    # directly or through per-row values computed from them (``_rejoins``)
    grown = True
    while grown:
        grown = False
        for n in list(interior):
            for user in n.users:
                if user in interior or user not in forward or user is out:
                    continue
                back = _rejoins(user, interior, forward, out)
                if back:
                    interior.update(back)
                    grown = True
    # token-by-token terms entering the scores: the mask, and score terms (a learned bias). A term
    # applied to the probabilities after the softmax (the keep mask of dropout on them) hides no
    # key from the softmax's normaliser: the chunk graphs take it sliced like any score term.
    normalised = _downstream({n for n in interior if _normalises(n, interior)}, interior)
    candidates = []
    for n in _in_graph_order(interior):
        if n in normalised:
            continue
        for x in n.all_input_nodes:
            xa = (sd.axes.get(x) or [None])[0]
            if x not in interior and xa and len(xa) >= 2 and xa[-1] and sd.table.canon(xa[-1]) == seq \
                    and any(d and sd.table.canon(d) == seq for d in xa[:-1]) and x is not scores \
                    and all(c[0] is not x for c in candidates) and not _same_everywhere(x) \
                    and not _ignored(x, n):
                candidates.append((x, n))
    mask, mask_user, conflict, terms = _choose_mask(candidates)
    chain = ()
    if terms:
        chain, conflict = _mask_chain(terms, interior)
    q, kt = _operands(scores)
    softmax = any(n.target in SOFTMAX_OPS for n in interior)
    # (statistics of the masked scores only: a key the mask hides still counts in those of the
    # scores before it)
    masked = {mask_user} | _downstream({mask_user}, interior) if mask_user is not None else set()
    stats = _key_statistics(masked, keys, sd, forward)
    return AttentionSite(index, "matmul-softmax", q, kt, out.args[1], out,
                         frozenset(interior | {out} | stats), False, mask, mask_user=mask_user, conflict=conflict,
                         softmax=softmax, mask_chain=chain, score_dims=_score_dims(mask_user, seq, sd))


def _score_dims(user, seq: tuple, sd) -> tuple:
    """(queries' dim, keys' dim), from the end, of the scores ``user`` returns: the keys the last
    dim of the sequence's axis, the queries the one before it (a dim of their own; where the
    queries share a dim with other axes, the default, which reads no causal pattern from it)."""
    axes = (sd.axes.get(user) or [None])[0] if user is not None else None
    if not axes:
        return (-2, -1)
    dims = [i - len(axes) for i, d in enumerate(axes) if d and sd.table.canon(d) == seq]
    return (dims[-2], dims[-1]) if len(dims) >= 2 else (-2, -1)


def _without_trailing_ones(axes, node):
    """``axes`` of ``node``'s value without the dims of size one at its end."""
    v = node.meta.get("val")
    if not axes or not isinstance(v, torch.Tensor) or len(v.shape) != len(axes):
        return axes
    n = len(axes)
    while n > 2 and same(v.shape[n - 1], 1):
        n -= 1
    return axes[:n]


# steps of per-row values between a statistic of the scores and its use in them
REJOIN_STEPS = 4


def _rejoins(start: fx.Node, interior: set, forward: set, out: fx.Node) -> set:
    """``start`` and the per-row values computed from it on a path back into ``interior`` (items of
    a reduction that returns several, pointwise ops; at most ``REJOIN_STEPS`` of them): a softmax
    statistic and what is computed from it before it meets the scores again (``max(-1).values``;
    ``_safe_softmax``'s rows with every key hidden, ``logical_not(any(logical_not(s == -inf)))``,
    choosing zeros over the probabilities). Empty when nothing returns."""
    reaches: dict = {}

    def back(n, steps):
        if n in reaches:
            return reaches[n]
        reaches[n] = False
        hit = False
        for u in n.users:
            if u is out or u not in forward:
                continue
            if u in interior:
                hit = True
            elif steps < REJOIN_STEPS and (u.target is operator.getitem or is_pointwise(u.target)) \
                    and back(u, steps + 1):
                hit = True
        reaches[n] = hit
        return hit

    return {n for n, hit in reaches.items() if hit} if back(start, 0) else set()


# reductions over the keys a chunk computes exactly from the keys it reads: the keys it does not
# read are hidden from its rows, and a hidden score changes neither a maximum nor a log-sum-exp
# (its exponential is zero), nor a sum of exponentials
KEY_STATISTICS = {aten.amax.default, aten.max.dim, aten.logsumexp.default}


def _key_statistics(masked: set, keys: set, sd, forward: set) -> set:
    """Per-row statistics of the masked scores over the keys read outside the attention
    (GraniteSWA's ``logsumexp``, scaling the output by a learned sink): reductions over the key
    dim of the nodes of ``masked`` (the scores from where the mask is applied; a sum only of
    their exponentials), each row's from its own scores and keys. They belong to the attention;
    what they compute after is per row."""
    stats = set()
    for n in masked:
        na = (sd.axes.get(n) or [None])[0]
        if not na:
            continue
        for user in n.users:
            if user in masked or user not in forward or user.args[0] is not n:
                continue
            if user.target not in KEY_STATISTICS and not (user.target is aten.sum.dim_IntList
                                                          and n.target is aten.exp.default):
                continue
            dims = user.args[1] if len(user.args) > 1 else user.kwargs.get("dim")
            dims = [dims] if isinstance(dims, int) else list(dims or [])
            if len(dims) == 1 and na[normalize_dim(dims[0], len(na))] \
                    and sd.table.canon(na[normalize_dim(dims[0], len(na))]) in keys:
                stats.add(user)
    return stats


# tensors made from sizes and one scalar: the same value at every (query, key) pair
FILLED = {aten.full.default: 1, aten.zeros.default: None, aten.ones.default: None, aten.new_full.default: 2,
          aten.new_zeros.default: None, aten.new_ones.default: None, aten.zeros_like.default: None,
          aten.ones_like.default: None, aten.full_like.default: 1, aten.scalar_tensor.default: 0}


def _ignored(x: fx.Node, n: fx.Node) -> bool:
    """Whether ``n`` ignores its input ``x``: ``baddbmm``'s input under ``beta=0`` (GPT-2's
    reordered attention writes the product into an uninitialised buffer so)."""
    return n.target is aten.baddbmm.default and n.args[0] is x and n.kwargs.get("beta", 1) == 0


def _same_everywhere(x: fx.Node) -> bool:
    """Whether a token-by-token term entering the scores has one finite value at every (query,
    key) pair (``baddbmm``'s zeros input, GPT-NeoX-Japanese's): it hides no key and weighs every
    key alike, so it is no mask; the chunk graphs make their own block of it from its sizes."""
    while x.target in (aten.expand.default, aten.view.default, aten._unsafe_view.default, aten.clone.default,
                       aten._to_copy.default, torch.ops.prims.convert_element_type.default):
        x = x.args[0]
        if not isinstance(x, fx.Node):
            return False
    if x.target not in FILLED:
        return False
    at = FILLED[x.target]
    value = x.args[at] if at is not None and len(x.args) > at else x.kwargs.get("fill_value", 0)
    return isinstance(value, (int, float)) and math.isfinite(value)


FUSED_SOFTMAX_OPS = (aten._softmax.default, aten._safe_softmax.default)
# a softmax over the keys, fused or decomposed (max, exp, sum): linear attention has none
SOFTMAX_OPS = FUSED_SOFTMAX_OPS + (aten.exp.default,)


def _normalises(n: fx.Node, interior: set) -> bool:
    """Whether ``n`` gives the softmax's probabilities: a fused softmax, or the division of a
    decomposed one (``exp(s - max) / sum``, or a product with the sum's reciprocal) by its sum
    over the keys, a reduction inside the attention."""
    if n.target in FUSED_SOFTMAX_OPS:
        return True
    if n.target is aten.div.Tensor:
        divisors = n.args[1:2]
    elif n.target is aten.mul.Tensor:
        divisors = [x.args[0] for x in n.args if isinstance(x, fx.Node) and x.target is aten.reciprocal.default]
    else:
        return False
    return any(isinstance(x, fx.Node) and x in interior and x.target is aten.sum.dim_IntList for x in divisors)


def _downstream(starts: set, within: set) -> set:
    """The nodes of ``within`` reached from ``starts`` through nodes of ``within``, ``starts``
    excluded."""
    out, stack = set(), [u for n in starts for u in n.users if u in within]
    while stack:
        n = stack.pop()
        if n not in out:
            out.add(n)
            stack.extend(u for u in n.users if u in within)
    return out


MASKING_OPS = (aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.where.self)


def _in_graph_order(nodes) -> list:
    order = {n: i for i, n in enumerate(next(iter(nodes)).graph.nodes)} if nodes else {}
    return sorted(nodes, key=order.__getitem__)


def _hides(x: fx.Node, user: fx.Node) -> bool:
    """Whether ``x`` is the condition of a masking op (``masked_fill``, ``where``) on the scores."""
    return user.target in MASKING_OPS and user.args[1 if user.target is not aten.where.self else 0] is x


def _choose_mask(candidates: list) -> tuple:
    """(mask, the node applying it, conflict, terms) among the token-by-token terms entering the
    scores.

    A term that is the condition of a masking op hides keys; a term added to the scores is a
    score term (a learned bias, ALiBi distances) that the chunk graphs take sliced like any
    other input, or a mask when it can hide keys (``_mask_like``: a mask input, or computed from
    per-token data or from constants alone). One such term is the mask. Several (two masking
    conditions, a padding mask added beside a masking op, two additive masks) are applied in
    sequence: ``terms`` lists them, (term, the op applying it) in graph order, and the mask is
    their composition (``_mask_chain``); ``mask`` and its op are then the last term's."""
    if not candidates:
        return None, None, None, ()
    hiding = [c for c in candidates if _hides(*c)]
    mask, user = hiding[-1] if hiding else candidates[-1]
    others = [x for x, _ in candidates if x is not mask]
    if len(hiding) > 1 or (others and hiding and any(_from_token_data(x) for x in others)):
        terms = [c for c in candidates if c in hiding or _mask_like(c[0])]
        return terms[-1][0], terms[-1][1], None, tuple(terms)
    if others and not hiding:
        masks = [c for c in candidates if _mask_like(c[0])]
        if len(masks) > 1:
            return masks[-1][0], masks[-1][1], None, tuple(masks)
        if masks:
            mask, user = masks[0]
    return mask, user, None, ()


# ops a chain of mask terms may hold between its terms: the value of every (query, key) pair is
# computed from the same pair of the inputs, so the chain can run on a zero scalar for the scores
CHAIN_OPS = MASKING_OPS + (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor)


def _mask_chain(terms: tuple, interior: set) -> tuple:
    """(chain, conflict) for mask terms applied in sequence: the interior nodes from the first
    term's op to the last's, in graph order. Every one must be an elementwise op whose only
    input from the scores is the previous node of the chain (the scores themselves for the
    first), so the chain's effect on zero scores is the one mask it applies; otherwise the
    masks are a conflict the layer plan refuses."""
    first, last = terms[0][1], terms[-1][1]
    chain = [n for n in _in_graph_order(interior)
             if n is first or n is last or (_reaches(first, n, interior) and _reaches(n, last, interior))]
    for prev, n in zip([None] + chain, chain):
        from_scores = [x for x in n.all_input_nodes if x in interior]
        if n.target not in CHAIN_OPS or len(from_scores) != 1 or (prev is not None and from_scores[0] is not prev):
            names = ", ".join(x.name for x, _ in terms)
            return (), f"the scores are masked by several terms ({names}) in a way not read as one mask: combine them into one"
    return tuple(chain), None


def _reaches(a: fx.Node, b: fx.Node, within: set) -> bool:
    stack, seen = [a], set()
    while stack:
        n = stack.pop()
        if n is b:
            return True
        if n in seen:
            continue
        seen.add(n)
        stack.extend(u for u in n.users if u in within)
    return False


def _mask_like(node: fx.Node) -> bool:
    """An additive term that can hide keys: a mask input, or one computed from per-token data or
    from constants and sizes alone; the rest are computed from floating-point inputs (a learned
    bias or slopes) and are score terms."""
    if node.op == "placeholder" or _from_token_data(node):
        return True
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor) and n.meta["val"].is_floating_point():
            return False
        stack.extend(n.all_input_nodes)
    return True


def _from_token_data(node: fx.Node) -> bool:
    """Whether a value is computed from an integer or boolean graph input (padding flags, position
    ids, a boolean mask) rather than from parameters, constants and sizes alone."""
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor) and not v.is_floating_point():
                return True
        stack.extend(n.all_input_nodes)
    return False
