"""Which keys each chunk of a streamed layer reads, found from the mask itself at run time.

A layer streams chunk [s, e) of queries against keys [lo, hi). For fused causal attention with
no mask that is [0, e). With a mask (padding, packed documents, sliding windows, a user's 4-D
mask, a mask that lets some queries see later keys), the keys a query may see depend on the
mask's values, so they are read from the mask: a small graph (the mask's part of the layer)
gives, per chunk of query rows and over every key, the first and last key any row may see,
and whether a row sees no key at all while its keys are masked with a finite value (a full
attention then averages that row over every key of the sequence). The chunk reads exactly the
keys it needs; a chunk that needs keys after its own end is "wide" (see ``LayerProgram``).

Results are cached: a mask input that is the same live tensor, unchanged (same storage,
offset, shape, strides and version), or a small per-token input equal to the one seen before,
gives the same key ranges without evaluating the mask again. The inputs a call compares by value
(a new step's position tensors) are compared at once, one read of the device, and the entry then
names them, so the step's other layers and its backward match them by identity, with no read.
The cache keeps no large tensor alive: it holds weak references to their storages, not to the
tensors (a layer's mask inputs are often views made anew in every layer, or in every call, of one
position tensor that lives through the step): an entry whose storage is freed never matches by
identity again.
"""
from __future__ import annotations

import dataclasses
import weakref

import torch

from .passes.kernels import hidden

SMALL = 1 << 20   # inputs up to this many elements are compared by value


@dataclasses.dataclass
class _Entry:
    refs: list        # weak references to the inputs' storages (``_owner``)
    ids: list         # (data_ptr, offset, shape, stride, version, dtype, device) of each
    copies: list      # value copies of the small inputs (None for large ones)
    result: list


def identity(x: torch.Tensor) -> tuple:
    return (x.data_ptr(), x.storage_offset(), tuple(x.shape), tuple(x.stride()), x._version, x.dtype, x.device)


def _owner(x: torch.Tensor):
    """What keeps ``x``'s memory: its storage (one Python object per storage while it lives), or
    ``x`` itself where it has none (a tensor subclass). While the storage lives, a tensor with
    ``x``'s identity (memory, layout, version: views and detached aliases share the version
    counter) holds ``x``'s values, whichever Python object it is."""
    try:
        return x.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return x


class RangeCache:
    """The last few key-range results of one mask graph, keyed by the mask's inputs."""

    def __init__(self, size: int = 8):
        self.size = size
        self.entries: list[_Entry] = []
        self.hits = self.misses = 0

    def get(self, inputs: list, extra: tuple):
        ids = [identity(x) for x in inputs]
        candidates = []   # (entry, the (copy, input) pairs it must equal by value), most recent first
        for entry in self.entries:
            if entry.result[0] != extra:
                continue
            compare = []
            for x, i, r, j, c in zip(inputs, ids, entry.refs, entry.ids, entry.copies):
                if i == j and r() is not None:
                    continue
                if c is None or not _alike(c, x):
                    break
                compare.append((c, x))
            else:
                if not compare:   # the same live tensors, unchanged: a hit with no read
                    return self._hit(entry, inputs, ids)
                candidates.append((entry, compare))
        # (an entry's result is a function of its inputs' values, so any entry equal to these gives
        # the same result): every candidate compared in one read of the device, however many
        if candidates:
            for (entry, _), equal in zip(candidates, _values_equal([compare for _, compare in candidates])):
                if equal:
                    return self._hit(entry, inputs, ids)
        self.misses += 1
        return None

    def _hit(self, entry: _Entry, inputs: list, ids: list):
        # the entry now names these inputs: the next call with the same live tensors (the other
        # layers of the step, the backward) matches without reading their values
        entry.refs, entry.ids = [weakref.ref(_owner(x)) for x in inputs], ids
        self.entries.remove(entry)
        self.entries.insert(0, entry)
        self.hits += 1
        return entry.result[1]

    def put(self, inputs: list, extra: tuple, result) -> None:
        copies = [x.detach().clone() if x.numel() <= SMALL else None for x in inputs]
        refs = [weakref.ref(_owner(x)) for x in inputs]
        self.entries.insert(0, _Entry(refs, [identity(x) for x in inputs], copies, [extra, result]))
        del self.entries[self.size:]


def _alike(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.device == b.device


def _values_equal(groups: list) -> list:
    """For each group of (a, b) pairs, whether every pair is equal in value; all groups read with
    one device-to-host transfer per device (on a GPU each read waits for the device: one read per
    call, not one per input or per cache entry)."""
    by_device: dict = {}
    where = []   # per group: the (device, index) of each pair's flag
    for pairs in groups:
        where.append([])
        for a, b in pairs:
            flags = by_device.setdefault(a.device, [])
            where[-1].append((a.device, len(flags)))
            flags.append((a == b).all())
    read = {d: torch.stack(flags).tolist() for d, flags in by_device.items()}
    return [all(read[d][i] for d, i in group) for group in where]


def reach(block: torch.Tensor, rows: tuple, kind: str, fill_finite: bool, key_dim: int,
          query_dim: int | None) -> torch.Tensor:
    """[first, last, finite_empty, causal] of one chunk's mask block (its query rows ``rows``,
    (s, e)) against every key: the first and last key any row may see, whether some row sees
    no key while its hidden scores are finite (see ``streamfx.passes.reach`` for ``kind`` and
    ``fill_finite``), and whether the block is exactly the causal mask: query row s + i sees
    keys 0..s + i and nothing else, and an additive mask adds exactly zero to what it lets through
    (the attention then equals the kernel's own causal attention without the mask)."""
    if kind == "additive":
        allowed = ~hidden(block) if block.is_floating_point() else block != 0
    elif kind == "allowed":
        allowed = block.bool()
    else:
        allowed = ~block.bool()
    causal = _causal(block, allowed, rows, kind, key_dim, query_dim)
    allowed = allowed.movedim(key_dim, -1)
    n = allowed.shape[-1]
    flags = allowed.to(torch.uint8)
    sees = allowed.any(-1)
    first = torch.where(sees, flags.argmax(-1), n).amin()
    last = torch.where(sees, n - 1 - flags.flip(-1).argmax(-1), -1).amax()
    if kind == "additive":
        # a row that sees no key depends on every key whose hidden score is finite
        empty = (~sees & torch.isfinite(block).movedim(key_dim, -1).any(-1)).any() if block.is_floating_point() \
            else (~sees).any()
    else:
        empty = (~sees).any() if fill_finite else torch.zeros((), dtype=torch.bool, device=block.device)
    return torch.stack([first, last, empty.to(first.dtype), causal.to(first.dtype)])


def _causal(block, allowed, rows: tuple, kind: str, key_dim: int, query_dim: int | None) -> torch.Tensor:
    nope = torch.zeros((), dtype=torch.bool, device=block.device)
    s, e = rows
    if query_dim is None:
        return nope
    pattern = allowed.movedim((query_dim % block.dim(), key_dim % block.dim()), (-2, -1))
    c, n = pattern.shape[-2:]
    if c != e - s or e > n:   # (a mask broadcast along the queries is not causal)
        return nope
    dev = block.device
    expected = torch.arange(n, device=dev) <= torch.arange(s, e, device=dev).unsqueeze(1)
    same = (pattern == expected).all()
    if kind == "additive" and block.is_floating_point():
        # what the mask lets through it must leave as it is (no bias, no scaling)
        same &= (torch.where(allowed, block, 0) == 0).all()
    return same


def all_causal(rows: torch.Tensor) -> bool:
    """Whether every chunk's mask was exactly causal (the 4th entry of ``reach``'s rows)."""
    return bool(rows[:, 3].all())


def union(rows: list) -> torch.Tensor:
    """The reach of several masks one chunk's rows are attended under (a layer's attention sites):
    the first key any of them may see, the last, whether any has a row that sees none, and whether
    all are causal."""
    if len(rows) == 1:
        return rows[0]
    stacked = torch.stack(rows)
    return torch.stack([stacked[:, 0].amin(), stacked[:, 1].amax(), stacked[:, 2].amax(), stacked[:, 3].amin()])


def ranges_from_reach(reach_rows: torch.Tensor, bounds, T: int) -> list:
    """Per chunk (klo, khi) from the stacked per-chunk rows [first, last, finite_empty, causal]: the keys
    [first, last], every key for a row that sees none under a finite mask, and [0, e) for a
    chunk whose rows see no key at all (their result does not depend on the keys)."""
    out = []
    for (s, e), (first, last, finite_empty, _) in zip(bounds, reach_rows.tolist()):
        if finite_empty:
            out.append((0, T))
        elif last < first:
            out.append((0, e))
        else:
            out.append((int(first), int(last) + 1))
    return out
