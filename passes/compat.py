"""What differs between the torch releases streamfx supports (2.11 to the latest), in one place.

Every name here resolves when the module is imported: a torch that has none of the forms known
fails there, loudly, never later inside a ``try`` that would turn it into "not streamed".
"""
from __future__ import annotations

import torch
from torch.fx.experimental import symbolic_shapes as _shapes

TORCH = torch.torch_version.TorchVersion(torch.__version__)

# The value torch's CUDA composite gives the hidden positions of a boolean mask it hands to the
# cuDNN kernel (``convert_boolean_attn_mask_cudnn``): float16's lowest, -65504 (-65536 in
# bfloat16), before 2.13; -inf, as for every other kernel, from 2.13.
CUDNN_BOOL_MASK_FILL = float("-inf") if TORCH >= (2, 13) else -65504.0

# A size's value for this compile without adding a guard: ``optimization_hint`` from torch 2.12,
# ``size_hint`` before (same arguments: the size, and a fallback for an unbacked symbol).
_optimization_hint = getattr(_shapes, "optimization_hint", None) or getattr(_shapes, "size_hint")


def size_hint(s, fallback: int = 1) -> int:
    """An int as it is; a symbol's hint (adds no guard), ``fallback`` for an unbacked one."""
    if isinstance(s, int):
        return s
    if isinstance(s, torch.SymInt) and s.node.hint is not None:
        return int(s.node.hint)
    return int(_optimization_hint(s, fallback=fallback))
