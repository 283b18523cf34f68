"""An attention mask's pattern, read from the graph itself, never from one call's data.

The mask's subgraph is evaluated on concrete values: constants (parameters and buffers, such
as a registered tril) as they are, sizes at this compile's values, and per-token data inputs
(attention masks, position ids) at neutral values: every token present, positions 0..T-1, one
document. The result gives the pattern the layer is planned for: causal, or a sliding window
of W keys. Data can only be read at run time: a mask computed from data inputs is marked with
them (``site.data``), and the runtime reads the keys each chunk needs from the mask itself at
every call (``streamfx.keyranges``), so no data can make a chunk miss a key.

A mask that is itself a token-by-token data input (a user's 4-D mask, or one built outside a
graph piece), or one whose hidden keys are chosen from the model's activations (through an
embedding or a projection: a sparse attention's selection of keys by index scores), cannot be
evaluated at all: it is planned as causal and read per call likewise.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from . import kernels, verify
from .graphs import ancestors, hint, in_order, is_tensor, val
from .rules import is_reduction

aten = torch.ops.aten
MAX_EVAL = 2048   # masks are evaluated at compile time up to this many tokens (T x T values)
COMPARISONS = {aten.sub.Tensor, aten.lt.Tensor, aten.le.Tensor, aten.gt.Tensor, aten.ge.Tensor,
               aten.eq.Tensor, aten.ne.Tensor}
# tensors whose values are fixed (the input's shape only): comparing with one is not comparing
# per-token values (Llama 4's left padding: ``mask.cumsum(-1) == zeros_like(mask)``)
CONSTANT_MAKERS = {aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
                   aten.empty_like.default, aten.zeros.default, aten.ones.default, aten.full.default,
                   aten.scalar_tensor.default}
# ops that compute activations from learned weights: a mask computed through one depends on the
# model's values, not on positions and flags alone
ACTIVATION_OPS = {aten.embedding.default, aten.mm.default, aten.bmm.default, aten.addmm.default,
                  aten.baddbmm.default, aten.convolution.default}


def classify(site, constants: dict, length) -> None:
    """Set ``site.mask_kind``, ``window``, ``data`` and ``is_causal`` from the mask's pattern.
    ``constants``: real values of graph inputs that are parameters or buffers; ``length``: the
    sequence length (an int or a SymInt)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if site.mask is None:
        site.mask_kind = "causal" if site.is_causal else "none"
        return
    with unset_fake_temporarily():  # the values below are real tensors
        target, nodes, preset = _subgraph(site)
    inputs = [n for n in nodes if n.op == "placeholder"]
    site.data = tuple(n for n in inputs if n not in constants and is_tensor(val(n)))
    unknowable = [n for n in site.data if not _per_token_data(n)]
    unknowable += _selected_by_activations(nodes)[:1]
    T = hint(length)
    if unknowable or T > MAX_EVAL:
        # planned as causal; the keys each chunk reads come from the mask at run time
        site.mask_kind = "data" if unknowable else "unevaluated"
        site.is_causal = True
        return
    with unset_fake_temporarily():
        value = _evaluate(target, nodes, constants, preset)
        value = _most_present(value, target, nodes, constants, preset, site.data)
        if value is not None and value.dim() >= 2:   # (queries and keys last: [.., T, T])
            value = value.movedim(site.score_dims, (-2, -1))
        allowed, varies = _allowed(value) if value is not None else (None, False)
        kind, window = pattern(allowed) if allowed is not None else ("unknown", None)
        more = kind == "causal" and (varies or _adds_values(value))
    if kind == "unknown":
        site.mask_kind = kind
        return
    if kind is None and value is not None:
        with unset_fake_temporarily():
            site.mask_note = _finite_fill_note(value)
    site.is_causal = kind is not None or site.is_causal
    site.mask_kind = kind or "unknown"
    site.window = window
    if more:
        # the keys of a causal pattern, and more than it in the mask: a bias on what it lets
        # through (ALiBi's slopes), or fewer keys for some heads or rows. The mask stays in the
        # chunk graph (not the kernel's own causal attention)
        site.mask_kind = "causal+values"


def pattern(allowed: torch.Tensor) -> tuple:
    """("causal", None), ("sliding-window", W), ("chunked", C) (a query sees the earlier keys of
    its own C-token block: Llama 4's ``attention_chunk_size``; chunk [s, e) reads keys
    [floor(s / C) * C, e)), or (None, None) for a [T, T] allowed matrix."""
    T = allowed.shape[-1]
    if allowed.shape[-2] != T:   # (a key beside the sequence's: nn.MultiheadAttention's add_bias_kv)
        return None, None
    pos = torch.arange(T)
    diff = pos.unsqueeze(1) - pos.unsqueeze(0)
    causal = diff >= 0
    if torch.equal(allowed, causal):
        return "causal", None
    if allowed.any() and torch.equal(allowed, allowed & causal):
        width = int((diff * allowed).max().item()) + 1
        if torch.equal(allowed, causal & (diff < width)):
            return "sliding-window", width
        blind = (~allowed[:, 0]).nonzero()
        block = int(blind[0]) if len(blind) else T
        if block > 0 and torch.equal(allowed, causal & ((pos // block).unsqueeze(1) == (pos // block).unsqueeze(0))):
            return "chunked", block
    return None, None


def _subgraph(site):
    """(node to evaluate, nodes in order, preset values). With unfused attention the mask is
    applied to zero scores (every term of a chain, ``site.mask_chain``, in turn): the result is
    additive whatever the mask's convention."""
    if site.mask_user is None:
        return site.mask, in_order(ancestors([site.mask]), site.mask.graph), {}
    user = site.mask_user
    chain = list(site.mask_chain) or [user]  # several mask terms applied in sequence: all of them
    # (the scores' own operands too: a mask added by the op that multiplies the queries and keys,
    # ``baddbmm(mask, q, kᵀ)``, is read on zero scores, not on a model run on neutral inputs)
    scores = set(site.nodes) | {site.query, site.key}
    preset = {x: _zeros(x) for x in chain[0].all_input_nodes if x in scores}
    others = [x for n in chain for x in n.all_input_nodes if x not in scores]
    nodes = in_order(ancestors(others) | set(chain), user.graph)
    return user, nodes, preset


def _selected_by_activations(nodes) -> list:
    """The nodes of a mask's subgraph that decide which keys it hides (booleans, indices) from the
    model's activations (token embeddings, projections: a sparse attention's key selection by
    index scores): such a mask has no pattern neutral inputs could show. Activations that only
    add values to what a mask lets through (Doge's per-key bias) leave its pattern to read."""
    act, found = set(), []
    for n in nodes:
        if n.op != "call_function" or not (n.target in ACTIVATION_OPS or any(x in act for x in n.all_input_nodes)):
            continue
        act.add(n)
        v = val(n)
        if is_tensor(v) and not v.is_floating_point():
            found.append(n)
    return found


def _zeros(node):
    v = val(node)
    return torch.zeros([hint(s) for s in v.shape], dtype=v.dtype)


def _per_token_data(node) -> bool:
    """An integer or boolean input of at most two dims: padding flags, position ids, document ids."""
    v = val(node)
    return v.dim() <= 2 and (v.dtype == torch.bool or not v.is_floating_point())


def _positions(node, within: set) -> bool:
    """Whether a per-token integer input holds positions (compared with, or subtracted from,
    other per-token values) rather than flags."""
    if val(node).dtype == torch.bool:
        return False
    seen, stack = set(), [node]
    while stack:
        n = stack.pop()
        for u in n.users:
            if u in within and u not in seen:
                if u.target in CONSTANT_MAKERS or is_reduction(u.target):
                    continue  # its values are not the input's, or a per-row summary (Llama 4 counts each
                    # row's left padding with a sum)
                if u.target in COMPARISONS and all(isinstance(a, fx.Node) and a.target not in CONSTANT_MAKERS
                                                   for a in u.args[:2]):
                    return True
                seen.add(u)
                stack.append(u)
    return False


def _neutral(node, within: set):
    """Every token present (flags all 1), or one document (positions 0..T-1 in every row)."""
    v = val(node)
    shape = [hint(s) for s in v.shape]
    if shape and _positions(node, within):
        return torch.arange(shape[-1], dtype=v.dtype).expand(shape).contiguous()
    return torch.ones(shape, dtype=v.dtype)


def _evaluate(target, nodes, constants, preset):
    try:
        return _run(target, nodes, constants, dict(preset))
    except Exception:
        if verify.enabled():
            raise
        return None


MAX_FLAG_INPUTS = 3   # flag inputs whose present value is looked for (2^n evaluations)


def _most_present(value, target, nodes, constants, preset, data):
    """The mask with every token present. Which value of a flag input means "present" is the
    model's convention: 1 for Hugging Face's attention_mask, 0 (False) for PyTorch's
    ``key_padding_mask`` (True where a key is padding). Flags at 1 (``value``), or another choice
    of 0 and 1 per flag input whose mask lets no query see a later key and hides fewer keys (a
    flag whose 0 opens a bidirectional prefix, a prefix-LM's, keeps the causal reading at 1: its
    later keys are read per call)."""
    within = set(nodes)
    flags = [n for n in data if n in within and val(n).dim() and not _positions(n, within)]
    if value is None or not flags or len(flags) > MAX_FLAG_INPUTS:
        return value
    best, seen = value, _allowed_count(value)
    for k in range(1, 1 << len(flags)):
        env = dict(preset)
        for i, n in enumerate(flags):
            if k >> i & 1:
                v = val(n)
                env[n] = torch.zeros([hint(d) for d in v.shape], dtype=v.dtype)
        try:
            other = _run(target, nodes, constants, env)
        except Exception:  # noqa: BLE001 - a choice the mask's code does not take (a division by a count)
            continue
        count = _allowed_count(other, causal=True) if other is not None and other.shape == value.shape else -1
        if count > seen:
            best, seen = other, count
    return best


def _allowed_count(value: torch.Tensor, causal: bool = False) -> int:
    """The (query, key) pairs a mask lets through; ``causal``: -1 where one is a later key."""
    v = _lets_through(value)
    if causal and (v.dim() < 2 or v.shape[-1] != v.shape[-2] or bool(v.tril().ne(v).any())):
        return -1
    return int(v.sum())


def _run(target, nodes, constants, env):
    """Evaluate the mask subgraph on the CPU, whatever device the graph runs on (a GPU graph's
    mask is read at compile time without touching the GPU, or needing one): its constants are
    copied to the CPU and tensors it creates are created there."""
    within = set(nodes)
    for n in nodes:
        if n in env:
            continue
        v = val(n)
        if n.op == "placeholder":
            env[n] = _on_cpu(constants[n]) if n in constants else (hint(v) if not is_tensor(v) else _neutral(n, within))
        elif n.op == "call_function":
            args, kwargs = fx.node.map_arg((n.args, n.kwargs), lambda x: env[x])
            if "device" in kwargs:
                kwargs = {**kwargs, "device": torch.device("cpu")}
            env[n] = n.target(*args, **kwargs)
        elif n.op == "get_attr" and isinstance(getattr(n.graph.owning_module, n.target, None), torch.Tensor):
            env[n] = _on_cpu(getattr(n.graph.owning_module, n.target))  # a lifted constant (a fill value)
        else:
            return None
    value = env[target]
    return value if type(value) is torch.Tensor else None


def _on_cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _lets_through(value: torch.Tensor) -> torch.Tensor:
    """True where a boolean, additive or 0/1 mask lets a query see a key."""
    return value if value.dtype == torch.bool else ~kernels.hidden(value) if value.is_floating_point() else value != 0


def _allowed(value: torch.Tensor) -> tuple:
    """(positions a query may attend to in any batch row or head of a boolean or additive mask,
    [T, T]; whether they differ between batch rows or heads)."""
    v = _lets_through(value)
    v = v.reshape(-1, *v.shape[-2:]) if v.dim() > 2 else v.unsqueeze(0)
    return v.any(0), not bool((v == v[:1]).all())


def _finite_fill_note(value: torch.Tensor) -> str | None:
    """Where an additive mask lets every key through by the hiding rule (``kernels.hidden``) but
    the positions at its lowest value, a finite negative fill, form a causal pattern: the cause to
    give instead of "not causal", with what to change (GPT-1's ``w * b + -1e4 * (1 - b)``)."""
    if not value.is_floating_point() or value.numel() == 0:
        return None
    fill = float(value.min())
    if not -float("inf") < fill < 0:
        return None
    v = value > fill
    v = v.reshape(-1, *v.shape[-2:]) if v.dim() > 2 else v.unsqueeze(0)
    kind, _ = pattern(v.any(0))
    if kind is None:
        return None
    limit = max(kernels.HIDDEN_AT_MOST, torch.finfo(value.dtype).min / 2)
    return (f"attention with a {kind} mask whose hidden keys get {fill:g}, a finite value above {limit:g} (the "
            f"highest value read as hiding a key): a masked key's weight, exp(score + mask - row max), is not zero "
            f"for every score, so every key may count; fill masked scores with torch.finfo(dtype).min, or use a "
            f"boolean mask, to stream")


def _adds_values(value: torch.Tensor) -> bool:
    """Whether an additive mask adds anything but zero where it lets a key through."""
    if not value.is_floating_point():
        return False
    return bool((torch.where(kernels.hidden(value), 0, value) != 0).any())
