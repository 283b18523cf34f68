"""The LM head under DeepSpeed ZeRO-3.

ZeRO-3 gathers each module's parameters in hooks around the module's forward, and those hooks
are ``torch.compiler.disable``d: Dynamo breaks the graph before and after every hooked module.
Around the LM head that break separates the projection from the loss, so the loss's graph
receives the logits for the whole sequence (``[B, T, V]``, the largest activation of a
long-sequence step, and their gradient too) and only the softmax and the loss over them can
stream.

``stream_head(model)`` takes DeepSpeed's hooks off the LM head and registers the head's
parameters as external parameters of the root module: ZeRO-3 then gathers them with the root's
own parameters when the forward starts (and again for the backward), and nothing cuts the graph
between the hidden states and the loss. The head and its loss compile as one graph and stream;
the logits exist one chunk at a time. Gradients are unchanged: ZeRO-3 reduces each gradient
through the parameter's own hooks, which stay. The cost is that the head's weight (``V x d``)
stays gathered for the forward and the backward rather than around the head alone.

    engine, *_ = deepspeed.initialize(model=model, ...)
    streamfx.zero3.stream_head(engine)
    engine.compile(backend="streambp")
"""
from __future__ import annotations

import torch

from .errors import StreamBPError

__all__ = ["stream_head"]

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks")


def _deepspeed_hook(fn) -> bool:
    return (getattr(fn, "__module__", None) or "").startswith("deepspeed.")


def stream_head(model, head: torch.nn.Module | list | tuple | None = None) -> list:
    """Keep the LM head of a ZeRO-3 model in the graph of its loss (see the module docstring).

    ``model``: the DeepSpeed engine or the module it wraps, after ``deepspeed.initialize``.
    ``head``: the module (or modules) to take out of ZeRO-3's per-module gathering; by default
    the model's output embeddings (``get_output_embeddings()``, every Hugging Face causal LM).
    Call it before the first forward of the compiled model. Returns the names of the parameters
    now gathered with the root module."""
    root = getattr(model, "module", model)
    if not isinstance(root, torch.nn.Module):
        raise StreamBPError(f"stream_head expects a DeepSpeed engine or the module it wraps, got {type(model).__name__}")
    if not any(hasattr(p, "ds_id") for p in root.parameters()):
        raise StreamBPError("stream_head: the model's parameters are not partitioned by DeepSpeed ZeRO-3 "
                            "(call it after deepspeed.initialize with zero_optimization.stage = 3)")
    if head is None:
        get = getattr(root, "get_output_embeddings", None)
        head = get() if callable(get) else None
        if head is None:
            raise StreamBPError("stream_head: the model has no get_output_embeddings(); pass the LM head module: "
                                "stream_head(engine, head=model.lm_head)")
    heads = list(head) if isinstance(head, (list, tuple)) else [head]
    members = {id(m) for m in root.modules()}
    for h in heads:
        if not isinstance(h, torch.nn.Module) or id(h) not in members:
            raise StreamBPError(f"stream_head: head must be a submodule of the model, got {type(h).__name__}")
        if h is root:
            raise StreamBPError("stream_head: head is the model itself; pass the LM head module")
    from deepspeed.runtime.zero.partition_parameters import register_external_parameter

    names = {id(p): n for n, p in root.named_parameters(remove_duplicate=False)}
    moved, seen = [], set()
    for h in heads:
        for m in h.modules():
            for attr in _HOOK_DICTS:
                hooks = getattr(m, attr)
                for key in [k for k, fn in hooks.items() if _deepspeed_hook(fn)]:
                    del hooks[key]
        for p in h.parameters():
            if id(p) not in seen and hasattr(p, "ds_id"):
                seen.add(id(p))
                register_external_parameter(root, p)
                moved.append(names.get(id(p), f"<parameter {p.ds_id}>"))
    return moved
