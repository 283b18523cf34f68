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

import torch

from streamfx import memory
from streamfx.passes import kernels


def _merge(kern, q, k, v, scale):
    """(merged output in q's dtype, merged log-sum-exp [B, H, L] fp32, each block's raw lse)."""
    L, n = q.shape[-2], k.shape[-2] - q.shape[-2]
    diag_out, diag_lse = kern.call(q, k.narrow(-2, n, L), v.narrow(-2, n, L), True, scale)
    if n == 0:
        return diag_out, kern.lse_view(diag_lse, L).float()
    pre_out, pre_lse = kern.call(q, k.narrow(-2, 0, n), v.narrow(-2, 0, n), False, scale)
    lp, ld = kern.lse_view(pre_lse, L).float(), kern.lse_view(diag_lse, L).float()
    lse = torch.logaddexp(lp, ld)
    out = pre_out.float() * torch.exp(lp - lse).unsqueeze(-1) + diag_out.float() * torch.exp(ld - lse).unsqueeze(-1)
    return torch.empty_like(diag_out).copy_(out), lse  # (in the kernel's own output layout)


@torch.library.custom_op("streamfx::causal_blocks", mutates_args=())
def causal_blocks(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  scale: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp [B, H, L] fp32) of causal attention aligned to the bottom right."""
    out, lse = _merge(kernels.BY_NAME[kernel], q, k, v, scale)
    return out, lse.contiguous()


@causal_blocks.register_fake
def _causal_blocks_fake(kernel, q, k, v, scale):
    L, n = q.shape[-2], k.shape[-2] - q.shape[-2]
    diag = kernels.BY_NAME[kernel].call(q, k.narrow(-2, n, L), v.narrow(-2, n, L), True, scale)[0]
    return torch.empty_like(diag), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("streamfx::causal_blocks_backward", mutates_args=())
def causal_blocks_backward(kernel: str, dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           out: torch.Tensor, lse: torch.Tensor,
                           scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv): each block's kernel backward, from the merged output and log-sum-exp."""
    kern = kernels.BY_NAME[kernel]
    L, n = q.shape[-2], k.shape[-2] - q.shape[-2]
    blocks = [(n, L, True)] + ([(0, n, False)] if n > 0 else [])
    dq = None
    dk, dv = torch.empty_like(k), torch.empty_like(v)  # (the layouts the fake kernel gives)
    for start, length, causal in blocks:
        kb, vb = k.narrow(-2, start, length), v.narrow(-2, start, length)
        out_b, lse_b = _in_kernel_layout(kern, q, kb, vb, causal, scale, out, lse)
        g = kern.call_backward(dout, q, kb, vb, out_b, lse_b, causal, scale)
        dq = g[0].float() if dq is None else dq + g[0]
        dk.narrow(-2, start, length).copy_(g[1])
        dv.narrow(-2, start, length).copy_(g[2])
    return torch.empty_like(q).copy_(dq), dk, dv


def _in_kernel_layout(kern, q, kb, vb, causal, scale, out, lse):
    """``out`` and ``lse`` ([B, H, L] fp32) in the layouts the kernel's own forward gives for these
    inputs (read from its meta kernel), as its backward expects them."""
    meta = [torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta") for x in (q, kb, vb)]
    out_lay, lse_lay = kern.call(*meta, causal, scale)
    out_k = torch.empty_strided(out_lay.shape, out_lay.stride(), dtype=out.dtype, device=out.device).copy_(out)
    lse_k = torch.empty_strided(lse_lay.shape, lse_lay.stride(), dtype=lse_lay.dtype, device=lse.device)
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


def _nbytes(x, itemsize=None):
    v = x.meta.get("val")
    n = v.numel()
    n = n.node.expr if isinstance(n, torch.SymInt) else n
    return n * (itemsize or v.element_size())


# What the ops make inside beyond their outputs, for the memory model: the forward, both blocks'
# outputs and their fp32 merge (four query-sized fp32 tensors); the backward, the blocks' kernel
# gradients of K and V before they are copied into dk, dv, and dq summed in fp32.
memory.WORKSPACE[torch.ops.streamfx.causal_blocks.default] = lambda n: 4 * _nbytes(n.args[1], 4)
memory.WORKSPACE[torch.ops.streamfx.causal_blocks_backward.default] = \
    lambda n: _nbytes(n.args[3]) + _nbytes(n.args[4]) + _nbytes(n.args[2], 4)
