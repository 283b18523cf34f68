"""CPU stand-ins of the CUDA attention kernels, for running their graphs where no GPU is.

``cuda_attention(kernel)`` makes ``F.scaled_dot_product_attention`` on CPU tensors dispatch the
way CUDA's ``attention.cpp`` does for one kernel ("flash", "efficient" or "cudnn"), and registers
CPU implementations of that kernel's forward and backward ATen ops. Each implementation keeps
what a chunk schedule depends on:

- how ``is_causal`` aligns when there are fewer queries than keys (flash: bottom-right, FA2's
  contract; efficient and cuDNN: top-left);
- its outputs and their layouts (the meta kernels' shapes and strides, so Inductor's stride
  assertions hold): flash's ``[B, H, L]`` log-sum-exp, the efficient kernel's padded to a
  multiple of 32, cuDNN's ``[B, H, L, 1]``;
- its backward's contract: it reads the forward's output and log-sum-exp (it does not recompute
  them), so a backward called with the output and log-sum-exp of a larger attention (blocks of
  keys merged) is exact, as on the GPU;
- how the composite prepares its inputs: boolean masks become additive; the efficient kernel's
  mask is padded on its key dim to a multiple of 8 and sliced back (``preprocess_mask``); flash
  pads the head dim to a multiple of 8; flash and cuDNN take grouped K/V heads, and grouped heads
  that would go to the efficient kernel go to the math kernel instead; flash takes no mask (SDPA
  picks the efficient kernel then).

The arithmetic is float32 math attention; dropout is not emulated. The registrations live as
long as the context.
"""
from __future__ import annotations

import contextlib
import math

import torch

from .passes.kernels import BY_NAME

aten = torch.ops.aten
KERNELS = ("flash", "efficient", "cudnn")
_CHECK_ALIGNMENT = [True]


def _meta_layout(op, args, kwargs) -> tuple:
    """The op's outputs as its meta kernel makes them (shapes, strides and dtypes)."""
    def meta(x):
        if isinstance(x, torch.Tensor):
            return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
        return x
    return op(*[meta(a) for a in args], **{k: meta(v) for k, v in kwargs.items()})


def _like(layout, value: torch.Tensor | None) -> torch.Tensor | None:
    """A CPU tensor with ``layout``'s shape and strides, holding ``value`` (broadcast into it)."""
    if layout is None:
        return None
    out = torch.empty_strided(layout.shape, layout.stride(), dtype=layout.dtype)
    if value is not None:
        out.copy_(value)
    return out


def _scores(q, k, bias, causal: str | None, scale):
    """fp32 scores [B, H, L, S] of queries against (group-repeated) keys, biased and causally masked."""
    L, S = q.shape[-2], k.shape[-2]
    k = k.float().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.float() @ k.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias.float()
    if causal is not None:
        shift = S - L if causal == "bottom-right" else 0
        allowed = torch.ones(L, S, dtype=torch.bool).tril(shift)
        s = s.masked_fill(~allowed, float("-inf"))
    return s


def _forward(q, k, v, bias, causal, scale):
    """(output fp32 [B, H, L, Dv], log-sum-exp fp32 [B, H, L])."""
    s = _scores(q, k, bias, causal, scale)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1)).nan_to_num(0.0)
    vv = v.float().repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return p @ vv, lse


def _backward(dout, q, k, v, bias, out, lse, causal, scale):
    """FlashAttention's backward from the given output and log-sum-exp: (dq, dk, dv, d_scores)."""
    groups = q.shape[1] // k.shape[1]
    scale_ = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = _scores(q, k, bias, causal, scale)
    p = torch.exp(s - lse.float().unsqueeze(-1)).nan_to_num(0.0)
    dout, out = dout.float(), out.float()
    vv = v.float().repeat_interleave(groups, dim=1)
    kk = k.float().repeat_interleave(groups, dim=1)
    dv = p.transpose(-1, -2) @ dout
    dp = dout @ vv.transpose(-1, -2)
    ds = p * (dp - (dout * out).sum(-1, keepdim=True))
    dq = (ds @ kk) * scale_
    dk = (ds.transpose(-1, -2) @ q.float()) * scale_

    def ungroup(g):
        B, H, S, D = g.shape
        return g.view(B, H // groups, groups, S, D).sum(2)
    return dq, ungroup(dk), ungroup(dv), ds


def _no_dropout(p):
    if p:
        raise NotImplementedError("streamfx.emulate: dropout inside emulated CUDA attention is not emulated")


# -- the CUDA ops, on CPU -----------------------------------------------------------------------
def flash_forward(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    _no_dropout(dropout_p)
    lay = _meta_layout(aten._scaled_dot_product_flash_attention.default, (q, k, v, dropout_p, is_causal,
                                                                          return_debug_mask), {"scale": scale})
    out, lse = _forward(q, k, v, None, "bottom-right" if is_causal else None, scale)
    seed, offset = torch.zeros(2, dtype=torch.int64), torch.zeros((), dtype=torch.int64)
    return (_like(lay[0], out), _like(lay[1], lse), None, None, lay[4], lay[5], seed, offset,
            _like(lay[8], None))


def flash_backward(dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal, seed, offset, *,
                   scale=None):
    lay = _meta_layout(aten._scaled_dot_product_flash_attention_backward.default,
                       (dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, dropout_p, is_causal, seed, offset),
                       {"scale": scale})
    dq, dk, dv, _ = _backward(dout, q, k, v, None, out, lse, "bottom-right" if is_causal else None, scale)
    return _like(lay[0], dq), _like(lay[1], dk), _like(lay[2], dv)


def efficient_forward(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    _no_dropout(dropout_p)
    if attn_bias is not None and _CHECK_ALIGNMENT[0] and not _aligned(attn_bias):
        raise RuntimeError(f"attn_bias is not correctly aligned (strides {attn_bias.stride()}): the efficient "
                           "kernel reads mask rows aligned to 8 elements")
    lay = _meta_layout(aten._scaled_dot_product_efficient_attention.default,
                       (q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal), {"scale": scale})
    out, lse = _forward(q, k, v, attn_bias, "top-left" if is_causal else None, scale)
    lse_out = _like(lay[1], None)
    lse_out.fill_(float("inf"))
    if compute_log_sumexp:
        lse_out[..., : lse.shape[-1]] = lse
    return _like(lay[0], out), lse_out, torch.zeros((), dtype=torch.int64), torch.zeros((), dtype=torch.int64)


def efficient_backward(dout, q, k, v, attn_bias, out, lse, seed, offset, dropout_p, grad_input_mask, is_causal=False,
                       *, scale=None):
    lay = _meta_layout(aten._scaled_dot_product_efficient_attention_backward.default,
                       (dout, q, k, v, attn_bias, out, lse, seed, offset, dropout_p, grad_input_mask, is_causal),
                       {"scale": scale})
    lse = lse[..., : q.shape[-2]]
    dq, dk, dv, ds = _backward(dout, q, k, v, attn_bias, out, lse, "top-left" if is_causal else None, scale)
    dbias = None
    if lay[3] is not None:
        dbias = ds.sum_to_size(attn_bias.shape)
    return _like(lay[0], dq), _like(lay[1], dk), _like(lay[2], dv), _like(lay[3], dbias)


def cudnn_forward(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                  *, scale=None):
    _no_dropout(dropout_p)
    lay = _meta_layout(aten._scaled_dot_product_cudnn_attention.default,
                       (q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask),
                       {"scale": scale})
    out, lse = _forward(q, k, v, attn_bias, "top-left" if is_causal else None, scale)
    zero = torch.zeros((), dtype=torch.int64)
    return _like(lay[0], out), _like(lay[1], lse.unsqueeze(-1)), None, None, lay[4], lay[5], zero, zero, None


def cudnn_backward(dout, q, k, v, out, lse, seed, offset, attn_bias, cum_q, cum_k, max_q, max_k, dropout_p, is_causal,
                   *, scale=None):
    lay = _meta_layout(aten._scaled_dot_product_cudnn_attention_backward.default,
                       (dout, q, k, v, out, lse, seed, offset, attn_bias, cum_q, cum_k, max_q, max_k, dropout_p,
                        is_causal), {"scale": scale})
    dq, dk, dv, _ = _backward(dout, q, k, v, attn_bias, out, lse.squeeze(-1), "top-left" if is_causal else None,
                              scale)
    return _like(lay[0], dq), _like(lay[1], dk), _like(lay[2], dv)


# -- the composite: what F.scaled_dot_product_attention calls on CUDA ---------------------------
def _additive(mask, dtype, kernel):
    """A boolean mask as the kernel's composite hands it on: hidden positions filled with the
    kernel's ``bool_mask_fill`` (cuDNN: -65504 before torch 2.13)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    fill = BY_NAME[kernel].bool_mask_fill
    return torch.where(mask, torch.zeros((), dtype=dtype), torch.full((), fill, dtype=dtype))


def _aligned(mask, align=8):
    return all(st % align == 0 for st in mask.stride()[:-1]) and mask.stride(-1) == 1


def _pad_last(x, align):
    last = x.shape[-1]
    return x if last % align == 0 else torch.nn.functional.pad(x, (0, align - last % align))


def _composite(kernel):
    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
        mask = _additive(attn_mask, q.dtype, "efficient" if kernel == "flash" and attn_mask is not None else kernel)
        grouped = q.shape[-3] != k.shape[-3]
        use = "efficient" if kernel == "flash" and mask is not None else kernel
        if grouped and enable_gqa and use == "efficient":  # no grouped heads: SDPA takes the math kernel
            return aten._scaled_dot_product_attention_math(q, k, v, mask, dropout_p, is_causal, scale=scale,
                                                           enable_gqa=True)[0]
        if use == "flash":  # the head dim padded to a multiple of 8, the scale of the unpadded one
            d = q.shape[-1]
            scale = 1.0 / math.sqrt(d) if scale is None else scale
            out = aten._scaled_dot_product_flash_attention(_pad_last(q, 8), _pad_last(k, 8), _pad_last(v, 8),
                                                           dropout_p, is_causal, False, scale=scale)[0]
            return out[..., :d] if out.shape[-1] != d else out
        lse = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        if use == "efficient":
            if mask is not None:
                if not _aligned(mask):
                    last = mask.shape[-1]
                    mask = torch.nn.functional.pad(mask, (0, 8 - last % 8))[..., :last]
                mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            return aten._scaled_dot_product_efficient_attention(q, k, v, mask, lse, dropout_p, is_causal,
                                                                scale=scale)[0]
        return aten._scaled_dot_product_cudnn_attention(q, k, v, mask, lse, dropout_p, is_causal, False,
                                                        scale=scale)[0]
    return sdpa


_IMPLS = {
    "flash": (("_scaled_dot_product_flash_attention", flash_forward),
              ("_scaled_dot_product_flash_attention_backward", flash_backward)),
    "efficient": (("_scaled_dot_product_efficient_attention", efficient_forward),
                  ("_scaled_dot_product_efficient_attention_backward", efficient_backward)),
    "cudnn": (("_scaled_dot_product_cudnn_attention", cudnn_forward),
              ("_scaled_dot_product_cudnn_attention_backward", cudnn_backward)),
}


@contextlib.contextmanager
def cuda_attention(kernel: str, check_alignment: bool = True):
    """Within the context, SDPA on CPU tensors runs CUDA's ``kernel`` ("flash", "efficient",
    "cudnn") as emulated here; the CPU ops of all three kernels are registered (a graph may hold
    another kernel than the one dispatched to, as the efficient kernel where flash gets a mask).

    ``check_alignment``: the efficient kernel raises on a mask whose rows are not aligned to 8
    elements, as on the GPU. Inductor realigns that mask itself for CUDA tensors only
    (``sdpa_constraint`` in its lowerings), so code Inductor compiled for the CPU runs with the
    check off."""
    import warnings

    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, not {kernel!r}")
    _CHECK_ALIGNMENT[0] = check_alignment
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        lib.impl("scaled_dot_product_attention", _composite(kernel), "CompositeImplicitAutograd")
        for pair in _IMPLS.values():
            for name, fn in pair:
                lib.impl(name, fn, "CPU")
    try:
        yield
    finally:
        lib._destroy()
        _CHECK_ALIGNMENT[0] = True
