"""Fused attention kernels as data: one entry per ATen op that attention lowers to.

Every fact a pass needs about a kernel lives here, and every pass reads it from here: where the
query, key, value, mask, causal flag and scale sit (its schema: argument names), how
``is_causal`` aligns when a chunk has fewer queries than keys, whether it takes a mask and
grouped K/V heads, how its composite pads the mask, its log-sum-exp layout, and how to call it
and its backward for one block of keys (``streamfx.blocks``). A new kernel is one entry.

Alignment when a chunk [s, e) reads keys [k0, e) (c = e - s queries, n = e - k0 keys): query i
of the chunk must see keys up to n - c + i ("bottom-right", FlashAttention-2's contract, and
``torch.nn.attention.bias.causal_lower_right``); a "top-left" kernel lets it see keys up to i.
A chunk on a top-left kernel runs as two calls: its unmasked prefix block [k0, s) and its
square diagonal block [s, e) (where both alignments agree), merged through their log-sum-exp.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import sympy
import torch

from .compat import CUDNN_BOOL_MASK_FILL
from .graphs import bind

aten = torch.ops.aten

# An additive mask hides a key with any value at or below the highest value a kernel's composite
# fills a boolean mask's hidden positions with (``Kernel.bool_mask_fill``: -inf, or cuDNN's -65504
# before torch 2.13), or below half its dtype's lowest value (Hugging Face's ``finfo.min``). Such a
# key's weight, exp(score + value - row max), is exactly zero in fp32 for any row that sees a key
# unless the row's scores spread by more than about 65,000; a row that sees none is averaged
# over every key by a finite fill (``streamfx.keyranges`` reads such rows whole).
HIDDEN_AT_MOST = -65504.0


def hidden(values: torch.Tensor) -> torch.Tensor:
    """Which positions of a floating-point additive mask hide their key."""
    return values <= max(HIDDEN_AT_MOST, torch.finfo(values.dtype).min / 2)


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    op: object                          # the forward overload
    backward: object | None             # its backward overload (reads the forward's output and lse)
    mask: str | None                    # the name of its mask argument; None: takes no mask
    alignment: str                      # is_causal with fewer queries than keys: "bottom-right" | "top-left"
    grouped_kv: bool                    # takes fewer K/V heads than query heads (query head h reads h // groups)
    mask_align: int | None = None       # its composite pads the mask's key dim to a multiple of this
    call: Callable | None = None        # (q, k, v, causal, scale) -> (out, raw lse): one block of keys, no mask
    call_backward: Callable | None = None  # (dout, q, k, v, out, raw lse, causal, scale, mask=None) -> (dq, dk, dv)
    lse_view: Callable | None = None    # (raw lse, L queries) -> its [B, H, L] view
    bool_mask_fill: float = float("-inf")  # what its composite gives a boolean mask's hidden positions
    workspace: Callable | None = None   # (q, k, keys, backward) -> bytes it allocates inside beyond its
                                        # outputs, for ``keys`` keys (sizes may be symbolic); None: nothing known
    dropout: str | None = "dropout_p"   # the name of its dropout probability argument (dropout drawn
                                        # inside the kernel, which a chunk's recomputation cannot replay)

    def workspace_bytes(self, q, k, keys, backward: bool):
        """``workspace`` for ``keys`` keys, 0 where the table knows none."""
        return self.workspace(q, k, keys, backward) if self.workspace is not None else 0

    @property
    def keeps(self) -> bool:
        """Whether a chunk's causal attention on it can run its backward from an output and
        log-sum-exp kept from the forward (``attention="keep"``): as blocks, as one call where
        the kernel aligns causal to the bottom right itself, or as one call with the chunk's mask
        (``keeps_masked``)."""
        return self.call_backward is not None and self.lse_view is not None and (
            self.blocks or self.alignment == "bottom-right" or self.keeps_masked)

    @property
    def keeps_masked(self) -> bool:
        """Whether its backward, called from a kept output and log-sum-exp, takes the call's mask."""
        return self.call_backward is not None and self.lse_view is not None and self.mask is not None

    @property
    def blocks(self) -> bool:
        """Whether a chunk can run as blocks merged through the log-sum-exp (the backward reads
        the output and log-sum-exp it is given)."""
        return self.call is not None


def _no_rng(q):
    """Philox seed and offset for a backward without dropout (read only when dropout is on)."""
    return torch.zeros((), dtype=torch.int64, device=q.device), torch.zeros((), dtype=torch.int64, device=q.device)


def _efficient(q, k, v, causal, scale):
    return aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal, scale=scale)[:2]


def _efficient_backward(dout, q, k, v, out, lse, causal, scale, mask=None):
    return aten._scaled_dot_product_efficient_attention_backward(dout, q, k, v, mask, out, lse, *_no_rng(q), 0.0,
                                                                 [True, True, True, False], causal, scale=scale)[:3]


def _cudnn(q, k, v, causal, scale):
    return aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, causal, False, scale=scale)[:2]


def _cudnn_backward(dout, q, k, v, out, lse, causal, scale, mask=None):
    return aten._scaled_dot_product_cudnn_attention_backward(dout, q, k, v, out, lse, *_no_rng(q), mask, None, None,
                                                             q.shape[-2], k.shape[-2], 0.0, causal, scale=scale)


def _flash_backward(dout, q, k, v, out, lse, causal, scale, mask=None):
    """FlashAttention-2's backward from its forward's output and log-sum-exp ([B, H, L] fp32), for a
    dense batch (no cumulative sequence lengths) without dropout."""
    return aten._scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse, None, None, q.shape[-2],
                                                             k.shape[-2], 0.0, causal, *_no_rng(q), scale=scale)[:3]


def _cpu_flash(q, k, v, causal, scale):
    return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)


def _cpu_flash_backward(dout, q, k, v, out, lse, causal, scale, mask=None):
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal,
                                                                     attn_mask=mask, scale=scale)


def size_expr(n):
    """A size as an int or a sympy expression (a symbolic size's expression)."""
    return n.node.expr if isinstance(n, torch.SymInt) else n


def _ceil_to(n, m):
    return -(-n // m) * m if isinstance(n, int) else sympy.ceiling(n / m) * m


def _cpu_flash_workspace(q, k, keys, backward):
    """``cpu_flash_attention`` and its backward (ATen's native/cpu/FlashAttentionKernel.cpp): one
    buffer per thread in the accumulation type, blocks of qSplit queries (256 from 768 queries, 64
    from 192, else 32) by kvSplit = min(512, keys) keys: the forward's scores, their row max and
    sum and a qSplit x D output block; the backward's scores and their gradients, and a copy of the
    output gradient; 16-bit inputs add the scores (and gradients) in their own type."""
    L, D, keys = size_expr(q.shape[-2]), size_expr(q.shape[-1]), size_expr(keys)
    split = {256: 768, 64: 192}
    qs = sympy.Piecewise(*[(sympy.Min(s, L), sympy.Ge(L, at)) for s, at in split.items()], (sympy.Min(32, L), True))
    kvs = sympy.Min(512, keys)
    acc = 8 if q.dtype == torch.float64 else 4
    low = q.dtype in (torch.bfloat16, torch.float16)
    if backward:
        per = 2 * qs * kvs * acc + (2 * qs * kvs * q.element_size() if low else 0)
        # (and the output gradient made contiguous in the kernel's [B, L, H, D] layout: a copy)
        return torch.get_num_threads() * per + size_expr(q.numel()) * q.element_size()
    per = (qs * kvs + 2 * qs + qs * D) * acc + (qs * kvs * q.element_size() if low else 0)
    return torch.get_num_threads() * per


def _flash_workspace(q, k, keys, backward):
    """FlashAttention-2's backward (ATen's native/transformers/cuda/flash_attn/flash_api.cpp,
    ``mha_bwd``): dq accumulated in fp32 over queries rounded up to 128 and a head dim rounded up
    to 32 (64 above 128), the fp32 row terms ``softmax_d``, and with fewer K/V heads than query
    heads dK and dV at every query head before their sum over each group. The forward: none."""
    if not backward:
        return 0
    B, H, L, D = (size_expr(n) for n in q.shape)
    keys, groups = size_expr(keys), q.shape[1] != k.shape[1]
    rows = B * _ceil_to(L, 128) * H
    dq = rows * _ceil_to(D, 32 if (isinstance(D, int) and D <= 128) else 64) * 4
    return dq + rows * 4 + (2 * B * keys * H * D * q.element_size() if groups else 0)


def workspace(node) -> int | object:
    """Bytes a kernel's op allocates inside beyond its outputs (0 when the table knows none)."""
    fwd, bwd = KERNELS.get(node.target), BY_BACKWARD.get(node.target)
    kern = fwd or bwd
    if kern is None:
        return 0
    q, k = (getattr(a, "meta", {}).get("val") for a in node.args[(0 if fwd else 1):(2 if fwd else 3)])
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)):
        return 0
    return kern.workspace_bytes(q, k, k.shape[-2], bwd is not None)


def _entries():
    def op(name):
        packet = getattr(aten, name, None)
        return packet.default if packet is not None else None

    same = lambda lse, n: lse  # noqa: E731
    rows = [
        Kernel("cpu-flash", op("_scaled_dot_product_flash_attention_for_cpu"),
               op("_scaled_dot_product_flash_attention_for_cpu_backward"), "attn_mask", "top-left", True,
               call=_cpu_flash, call_backward=_cpu_flash_backward, lse_view=same, workspace=_cpu_flash_workspace),
        Kernel("flash", op("_scaled_dot_product_flash_attention"), op("_scaled_dot_product_flash_attention_backward"),
               None, "bottom-right", True, call_backward=_flash_backward, lse_view=same, workspace=_flash_workspace),
        Kernel("efficient", op("_scaled_dot_product_efficient_attention"),
               op("_scaled_dot_product_efficient_attention_backward"), "attn_bias", "top-left", False, mask_align=8,
               call=_efficient, call_backward=_efficient_backward, lse_view=lambda lse, n: lse[..., :n]),
        Kernel("cudnn", op("_scaled_dot_product_cudnn_attention"), op("_scaled_dot_product_cudnn_attention_backward"),
               "attn_bias", "top-left", True, call=_cudnn, call_backward=_cudnn_backward,
               lse_view=lambda lse, n: lse[..., 0], bool_mask_fill=CUDNN_BOOL_MASK_FILL),
        Kernel("math", op("_scaled_dot_product_attention_math"), None, "attn_mask", "top-left", False),
        Kernel("overrideable", op("_scaled_dot_product_fused_attention_overrideable"),
               op("_scaled_dot_product_fused_attention_overrideable_backward"), "attn_bias", "top-left", False),
        Kernel("composite", op("scaled_dot_product_attention"), None, "attn_mask", "top-left", False),
    ]
    return {k.op: k for k in rows if k.op is not None}


KERNELS: dict = _entries()
BY_NAME: dict = {k.name: k for k in KERNELS.values()}
FORWARD_OPS = tuple(KERNELS)
BACKWARD_OPS = tuple(k.backward for k in KERNELS.values() if k.backward is not None)
BY_BACKWARD: dict = {k.backward: k for k in KERNELS.values() if k.backward is not None}


def of(node) -> Kernel | None:
    """The kernel a graph node calls, or None."""
    return KERNELS.get(getattr(node, "target", None))


def dropout_of(node):
    """The dropout probability a kernel call draws inside (None: none; a number or a symbolic
    value otherwise)."""
    kern = of(node)
    if kern is None or kern.dropout is None:
        return None
    p = bind(node).get(kern.dropout)
    return None if p is None or (isinstance(p, (int, float)) and p == 0) else p
