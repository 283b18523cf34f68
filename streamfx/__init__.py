"""streamfx: StreamBP as a torch.compile backend.

``torch.compile(model, backend="streambp")`` trains causal language models with exact gradients
while the sequence-length-sized activations and logits exist one chunk at a time. In trainers:
``Trainer(..., callbacks=[streamfx.StreamBPCallback()])``; accelerate or a loop of your own:
``model = streamfx.prepare(model)`` (``streamfx.trainers``).
"""
import sys as _sys

from .config import StreamConfig
from .errors import StreamBPError
from .backend import backend, streambp_backend
from .explain import explain, Report

__all__ = ["StreamConfig", "StreamBPError", "backend", "streambp_backend", "explain", "Report",
           "prepare", "StreamBPCallback", "plan_memory"]
__version__ = "0.1.0"

_TRAINERS = ("prepare", "StreamBPCallback", "state_of")


def __getattr__(name):  # the trainer helpers import transformers: loaded on first use
    if name in _TRAINERS:
        from . import trainers

        return getattr(trainers, name)
    if name == "plan_memory":  # (lazily: ``python -m streamfx.plan`` runs that module as __main__)
        from .plan import plan_memory

        return plan_memory
    if name == "zero3":  # DeepSpeed ZeRO-3's LM head: streamfx.zero3.stream_head(engine)
        import importlib

        return importlib.import_module(".zero3", __name__)
    raise AttributeError(f"module 'streamfx' has no attribute {name!r}")


if "accelerate.utils.dataclasses" in _sys.modules:  # accelerate already loaded: its error names our line
    from .trainers import install_accelerate_hint as _hint

    _hint()
