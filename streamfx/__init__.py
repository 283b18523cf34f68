"""streamfx: StreamBP as a torch.compile backend.

``torch.compile(model, backend="streambp")`` trains causal language models with exact
gradients while the sequence-length-sized activations and logits exist one chunk at a time.
"""
from .config import StreamConfig
from .errors import StreamBPError
from .backend import backend, streambp_backend
from .explain import explain, Report

__all__ = ["StreamConfig", "StreamBPError", "backend", "streambp_backend", "explain", "Report"]
__version__ = "0.1.0"
