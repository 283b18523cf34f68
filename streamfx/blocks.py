"""Causal attention of a chunk against a longer key prefix, on a kernel whose causal is top-left.

A chunk of c queries reads n >= c keys; causally, query i sees keys up to n - c + i (aligned to
the bottom right). A top-left kernel's ``is_causal`` would let it see keys up to i, so the chunk
runs as two calls of the model's own kernel (``streamfx.passes.kernels``): the prefix block (keys
[0, n - c), every query sees every key: no mask) and the diagonal block (keys [n - c, n), square,
where top-left and bottom-right agree), merged through their log-sum-exp:
``out = (exp(lse_p) * out_p + exp(lse_d) * out_d) / (exp(lse_p) + exp(lse_d))``.

The backward calls the kernel's own backward on each block with the MERGED output and
log-sum-exp: a fused attention backward recomputes its probabilities as ``exp(s - lse)`` and its
row term from ``dout · out``, so given the whole row's statistics each block's gradients are
exactly its part of the whole attention's (the identity ring and blockwise attention rely on).
No [c, n] mask exists, and no key is read twice.
"""
from __future__ import annotations

import sympy
import torch

from streamfx import memory
from streamfx.passes import kernels
from streamfx.passes.specs import accumulation_dtype


def _merge(kern, q, k, v, scale):
    """(merged output in q's dtype, merged log-sum-exp [B, H, L] in q's accumulation dtype)."""
    L, n = q.shape[-2], k.shape[-2] - q.shape[-2]
    acc = accumulation_dtype(q.dtype)
    diag_out, diag_lse = kern.call(q, k.narrow(-2, n, L), v.narrow(-2, n, L), True, scale)
    if n == 0:
        return diag_out, kern.lse_view(diag_lse, L).to(acc)
    pre_out, pre_lse = kern.call(q, k.narrow(-2, 0, n), v.narrow(-2, 0, n), False, scale)
    lp, ld = kern.lse_view(pre_lse, L).to(acc), kern.lse_view(diag_lse, L).to(acc)
    lse = torch.logaddexp(lp, ld)
    # out = pre_out * exp(lp - lse) + diag_out * exp(ld - lse) in fp32 (fp64), in place in the
    # blocks' own outputs where they are in it already (the same products and sum, rounded the same)
    out = pre_out.to(acc)
    del pre_out
    out.mul_(torch.exp(lp - lse).unsqueeze(-1))
    out.add_(diag_out.to(acc).mul_(torch.exp(ld - lse).unsqueeze(-1)))
    if out.dtype == diag_out.dtype and out.stride() == diag_out.stride():
        return out, lse
    return torch.empty_like(diag_out).copy_(out), lse  # (in the kernel's own output layout)


@torch.library.custom_op("streamfx::causal_blocks", mutates_args=())
def causal_blocks(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp [B, H, L] in q's accumulation dtype) of causal attention aligned to
    the bottom right."""
    out, lse = _merge(kernels.BY_NAME[kernel], q, k, v, scale)
    return out, lse.contiguous()


@causal_blocks.register_fake
def _causal_blocks_fake(kernel, q, k, v, scale):
    L, n = q.shape[-2], k.shape[-2] - q.shape[-2]
    diag = kernels.BY_NAME[kernel].call(q, k.narrow(-2, n, L), v.narrow(-2, n, L), True, scale)[0]
    return torch.empty_like(diag), q.new_empty(q.shape[:-1], dtype=accumulation_dtype(q.dtype))


@torch.library.custom_op("streamfx::causal_blocks_backward", mutates_args=())
def causal_blocks_backward(kernel: str, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor,
                           scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): each block's kernel backward, from the merged output and log-sum-exp. The
    prefix block (the larger) first; each block's kernel gradients are freed before the next."""
    kern = kernels.BY_NAME[kernel]
    L, n = q.shape[-2], k.shape[-2] - q.shape[-2]
    blocks = ([(0, n, False)] if n > 0 else []) + [(n, L, True)]
    dq = None
    dk, dv = torch.empty_like(k), torch.empty_like(v)  # (the layouts the fake kernel gives)
    for start, length, causal in blocks:
        kb, vb = k.narrow(-2, start, length), v.narrow(-2, start, length)
        out_b, lse_b = _in_kernel_layout(kern, q, kb, vb, causal, scale, out, lse)
        dq_b, dk_b, dv_b = kern.call_backward(dout, q, kb, vb, out_b, lse_b, causal, scale)[:3]
        del out_b, lse_b
        dk.narrow(-2, start, length).copy_(dk_b)
        dv.narrow(-2, start, length).copy_(dv_b)
        del dk_b, dv_b
        dq = dq_b.to(accumulation_dtype(q.dtype)) if dq is None else dq.add_(dq_b)   # (summed in fp32, fp64)
        del dq_b
    if dq.dtype == q.dtype and dq.stride() == q.stride():
        return dq, dk, dv
    return torch.empty_like(q).copy_(dq), dk, dv


def _in_kernel_layout(kern, q, kb, vb, causal, scale, out, lse):
    """``out`` and ``lse`` ([B, H, L]) in the layouts the kernel's own forward gives for these
    inputs (read from its meta kernel), as its backward expects them. The log-sum-exp's dtype is
    q's accumulation dtype, as the kernels give it (torch 2.11's meta kernel of the CPU flash
    attention says float32 for float64 inputs, whose kernel computes and expects float64)."""
    meta = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta") for x in (q, kb, vb)]
    out_lay, lse_lay = kern.call(*meta, causal, scale)
    out_k = torch.empty_strided(out_lay.shape, out_lay.stride(), dtype=out.dtype, device=out.device).copy_(out)
    lse_k = torch.empty_strided(lse_lay.shape, lse_lay.stride(), dtype=accumulation_dtype(q.dtype), device=lse.device)
    view = kern.lse_view(lse_k, lse.shape[-1])
    view.copy_(lse.view(view.shape))
    return out_k, lse_k


@causal_blocks_backward.register_fake
def _causal_blocks_backward_fake(kernel, dout, q, k, v, out, lse, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx, inputs, output):
    kernel, q, k, v, scale = inputs
    ctx.kernel, ctx.scale = kernel, scale
    ctx.save_for_backward(q, k, v, *output)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = causal_blocks_backward(ctx.kernel, dout.contiguous(), q, k, v, out, lse, ctx.scale)
    return None, dq, dk, dv, None


causal_blocks.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("streamfx::kept_blocks", mutates_args=())
def kept_blocks(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                lse: torch.Tensor, scale: float | None) -> torch.Tensor:
    """``causal_blocks``' output where its forward ran already: ``out`` and ``lse`` (the merged
    log-sum-exp, [B, H, L] fp32) were kept from it (``attention="keep"``). Returns ``out`` (a
    copy: an op's output aliases none of its inputs); its backward is ``causal_blocks``' own, from
    the kept ``out`` and ``lse``, so nothing of the attention's forward runs again."""
    return out.clone()


@kept_blocks.register_fake
def _kept_blocks_fake(kernel, q, k, v, out, lse, scale):
    return torch.empty_like(out)


def _kept_setup(ctx, inputs, output):
    kernel, q, k, v, out, lse, scale = inputs
    ctx.kernel, ctx.scale = kernel, scale
    ctx.save_for_backward(q, k, v, out, lse)


def _kept_backward(ctx, dout):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = causal_blocks_backward(ctx.kernel, dout.contiguous(), q, k, v, out, lse, ctx.scale)
    return None, dq, dk, dv, None, None, None


kept_blocks.register_autograd(_kept_backward, setup_context=_kept_setup)


@torch.library.custom_op("streamfx::kept_attention", mutates_args=())
def kept_attention(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, mask: torch.Tensor | None, causal: bool, scale: float | None) -> torch.Tensor:
    """A chunk's attention run as one call of its kernel (flash's own bottom-right causal, or any
    kernel with the chunk's mask), where its forward ran already: ``out`` and ``lse`` ([B, H, L]
    fp32) kept from it. Returns ``out`` (a copy); its backward is the kernel's, from them (and the
    mask)."""
    return out.clone()


@kept_attention.register_fake
def _kept_attention_fake(kernel, q, k, v, out, lse, mask, causal, scale):
    return torch.empty_like(out)


def _kept_attention_setup(ctx, inputs, output):
    kernel, q, k, v, out, lse, mask, causal, scale = inputs
    ctx.kernel, ctx.causal, ctx.scale = kernel, causal, scale
    ctx.save_for_backward(q, k, v, out, lse, mask)


def _kept_attention_backward(ctx, dout):
    q, k, v, out, lse, mask = ctx.saved_tensors
    if mask is not None and ctx.needs_input_grad[6]:
        raise RuntimeError("streamfx: attention='keep' with an attention mask that needs a gradient "
                           "(the kernel's backward from a kept output gives none)")
    kern = kernels.BY_NAME[ctx.kernel]
    if kern.call is not None:   # (the output and lse in the layouts its forward gives)
        out, lse = _in_kernel_layout(kern, q, k, v, ctx.causal, ctx.scale, out, lse)
    else:
        out, lse = (out if out.stride(-1) == 1 else out.contiguous()), lse.contiguous()
    dq, dk, dv = kern.call_backward(dout.contiguous(), q, k, v, out, lse, ctx.causal, ctx.scale, mask)[:3]
    return None, dq, dk, dv, None, None, None, None, None


kept_attention.register_autograd(_kept_attention_backward, setup_context=_kept_attention_setup)


# What the ops allocate inside beyond their outputs, for the memory model (``memory.WORKSPACE``),
# phase by phase as the code above runs, with each block's kernel workspace from the kernel table.
def _sizes(q, k, v):
    """(bytes of a query-sized tensor, of it in fp32, of one key's K and V rows, keys, queries)."""
    S = memory.nbytes_expr(q)
    rows, keys = kernels.size_expr(q.shape[-2]), kernels.size_expr(k.shape[-2])
    return S, S * 4 / q.element_size(), (memory.nbytes_expr(k) + memory.nbytes_expr(v)) / keys, keys, rows


def _forward_workspace(node):
    """Each block's output while its kernel runs (with the kernel's workspace), the diagonal
    block's beside the prefix block's call; an fp32 merge runs in place in the prefix block's
    output (the op's output), a 16-bit one in two fp32 temporaries beside the diagonal output."""
    kern, q, k, v = kernels.BY_NAME[node.args[0]], *(a.meta["val"] for a in node.args[1:4])
    S, S32, _, keys, L = _sizes(q, k, v)
    merge = 0 if q.dtype == torch.float32 else S + 2 * S32
    # (the op's output, counted with its outputs: the diagonal block's output stands in it first)
    return sympy.Max(kern.workspace_bytes(q, k, L, False), S + kern.workspace_bytes(q, k, keys - L, False), merge)


def _backward_workspace(node):
    """Per block: its output and lse copied into the kernel's layout, the kernel's dq, dK and dV
    over the block's keys, and its workspace; during the diagonal block (the second) also dq
    summed in fp32 (copied into the op's dq output at the end, in the query's layout)."""
    kern, q, k, v = kernels.BY_NAME[node.args[0]], *(a.meta["val"] for a in node.args[2:5])
    S, S32, kv_row, keys, L = _sizes(q, k, v)
    lse = S32 / q.shape[-1]
    # (the op's dq output, counted with its outputs, is made at the end: a block's dq stands in it)
    prefix = S + lse + kv_row * (keys - L) + kern.workspace_bytes(q, k, keys - L, True)
    diag = S32 + S + lse + kv_row * L + kern.workspace_bytes(q, k, L, True)
    return sympy.Max(prefix, diag)


memory.WORKSPACE[torch.ops.streamfx.causal_blocks.default] = _forward_workspace
memory.WORKSPACE[torch.ops.streamfx.causal_blocks_backward.default] = _backward_workspace
