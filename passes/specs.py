"""How a streamed region reads each input per chunk and puts each output together.

One type, shared by the plan (which chooses), the rewrite (which builds chunk graphs for it)
and the runtime (which slices and accumulates by it). For a chunk of query rows [s, e) whose
queries see keys [lo, ke) (lo = 0 and ke = e for causal attention):

  inputs   chunk(d)      rows [s, e) along dim d
           chunk(d, merged) dim d merges the sequence with another dim, as for cat below: rows
                         [s, e) of the sequence within it, for each index of the other dim
                         (read as one [other*c] dim; its gradient written back the same way)
           prefix(d)     the keys [lo, ke) along dim d (key positions, padding flags)
           qk(dq, dk)    rows [s, e) along dq and keys [lo, ke) along dk (a token-by-token mask)
           WHOLE         as it is (parameters, sequence-free values)
  outputs  cat(d)        chunk results written to rows [s, e) along dim d
           cat(d, merged) dim d merges the sequence with another dim (batch and tokens as one
                         [B*T] dim: merged "inner"; [T*B]: "outer"); a chunk's rows are
                         [s, e) of the sequence within it, for each index of the other dim
           SUM           chunk results summed (in fp32)
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Spec:
    kind: str
    dim: int | None = None
    kdim: int | None = None
    merged: str | None = None    # cat: where the sequence sits in a merged dim ("inner", "outer")

    # inputs ------------------------------------------------------------------------------
    @staticmethod
    def chunk(d: int, merged: str | None = None) -> "Spec":
        return Spec("chunk", d, merged=merged)

    @staticmethod
    def prefix(d: int) -> "Spec":
        return Spec("prefix", d)

    @staticmethod
    def qk(dq: int, dk: int) -> "Spec":
        return Spec("qk", dq, dk)

    # outputs -----------------------------------------------------------------------------
    @staticmethod
    def cat(d: int, merged: str | None = None) -> "Spec":
        return Spec("cat", d, merged=merged)

    def rows(self, full: torch.Tensor, s: int, e: int, T: int) -> torch.Tensor:
        """The view of a cat output's full-length ``full`` (or its gradient) that holds a chunk's
        rows [s, e), with a merged dim split in two (see ``split``)."""
        if self.merged is None:
            return full.narrow(self.dim, s, e - s)
        seq = self.dim + (1 if self.merged == "inner" else 0)
        return self.split(full.contiguous(), T).narrow(seq, s, e - s)

    def put_rows(self, buf: torch.Tensor, g: torch.Tensor, s: int, e: int, T: int, add: bool = False) -> None:
        """A chunk's rows [s, e) ``g`` of a per-row input's gradient into its full-length buffer
        ``buf`` (added, or written where each row gets one value): rows of a dim that merges the
        sequence with another for a merged spec (``buf`` then dense, so that its view is written)."""
        if self.merged is not None and not buf.is_contiguous():
            raise RuntimeError("streamfx: a merged input's gradient buffer must be dense")
        rows = self.rows(buf, s, e, T)
        g = self.split(g, e - s)
        rows.add_(g) if add else rows.copy_(g)

    def split(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """``x`` with a merged dim split into (other, n) ("inner") or (n, other) ("outer");
        ``x`` as it is for a plain cat."""
        if self.merged is None:
            return x
        other = x.shape[self.dim] // n
        return x.unflatten(self.dim, (other, n) if self.merged == "inner" else (n, other))

    def full_length(self, x: torch.Tensor, n: int, T: int) -> list:
        """The shape of the full output of which ``x`` holds a chunk of ``n`` tokens."""
        shape = list(x.shape)
        shape[self.dim] = shape[self.dim] // n * T
        return shape

    @property
    def sliced(self) -> bool:
        """The input is read in parts (so it is kept for the backward whole)."""
        return self.kind in ("chunk", "prefix", "qk")

    @property
    def per_row(self) -> bool:
        """The input's rows are the chunk's query rows (it gets a per-row gradient)."""
        return self.kind == "chunk"

    def seq_dims(self) -> tuple:
        """(dim, role) of each sequence dim: role "q" for query rows, "k" for keys."""
        if self.kind == "chunk":
            return ((self.dim, "q"),)
        if self.kind == "prefix":
            return ((self.dim, "k"),)
        if self.kind == "qk":
            return ((self.dim, "q"), (self.kdim, "k"))
        return ()

    def take(self, x: torch.Tensor, s: int, e: int, lo: int = 0, ke: int | None = None,
             T: int | None = None) -> torch.Tensor:
        """The part of input ``x`` a chunk [s, e) with keys [lo, ke) reads (ke defaults to e); ``T``:
        the call's length (read where the sequence is merged with another dim)."""
        ke = e if ke is None else ke
        if self.kind == "chunk" and self.merged is not None:
            # rows [s, e) of the sequence for each index of the other dim, merged again as one dim
            return self.rows(x, s, e, T).contiguous().flatten(self.dim, self.dim + 1)
        if self.kind == "chunk":
            return dense(x.narrow(self.dim, s, e - s), dim_order(x.shape, x.stride()))
        if self.kind == "prefix":
            return dense(x.narrow(self.dim, lo, ke - lo), dim_order(x.shape, x.stride()))
        if self.kind == "qk":
            return dense(x.narrow(self.dim, s, e - s).narrow(self.kdim, lo, ke - lo), dim_order(x.shape, x.stride()))
        return x

    def __str__(self) -> str:
        if self.kind == "qk":
            return f"qk({self.dim},{self.kdim})"
        if self.merged:
            return f"{self.kind}({self.dim},{self.merged})"
        return self.kind if self.dim is None else f"{self.kind}({self.dim})"


WHOLE = Spec("whole")
SUM = Spec("sum")


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums over chunks are kept in, and a fused attention's log-sum-exp: float32 for
    float32 and the 16-bit floats, the dtype itself for float64 (whose kernels compute in it)."""
    return torch.promote_types(dtype, torch.float32) if dtype.is_floating_point else dtype


def dim_order(shape, stride) -> tuple | None:
    """The order of a dense tensor's dims from outermost to innermost where it is not row-major
    (a transposed view: the queries handed from one graph piece to the next as [B, H, T, D] over
    [B, T, H, D] memory), else None. A chunk of such an input is copied in the same order: the
    graph was traced on that layout, and a view that is valid on it need not be on a row-major
    copy. ``shape`` and ``stride`` are ints (a fake value's are read by their hints)."""
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    order = sorted(range(len(shape)), key=lambda d: (shape[d] != 1, -stride[d], d))
    expected = 1
    for d in reversed([d for d in order if d in dims]):
        if stride[d] != expected:
            return None  # overlapping (an expand) or not dense: copied row-major
        expected *= shape[d]
    inner = [d for d in order if d in dims]
    return None if inner == dims else tuple(order)


def leading(d: int, rank: int) -> list:
    """The dim order with ``d`` outermost and the other dims row-major after it (a sequence-major
    K/V buffer's, whose every prefix along ``d`` is dense)."""
    return [d] + [k for k in range(rank) if k != d]


def empty_in_order(shape, order, dtype, device):
    """An empty dense tensor of ``shape`` whose dims lie in memory in ``order`` (outermost first;
    None: row-major)."""
    if order is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.empty([shape[d] for d in order], dtype=dtype, device=device).permute(
        [order.index(d) for d in range(len(shape))])


def dense(x, order: tuple | None):
    """``x`` as a dense tensor whose dims lie in ``order`` (row-major for None): ``x`` itself
    where it already is one."""
    if order is None:
        return x.contiguous()
    perm = x.permute(order)
    if perm.is_contiguous():
        return x
    return perm.contiguous().permute([order.index(d) for d in range(x.dim())])

