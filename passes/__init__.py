"""Graph passes of streamfx: analyses (seq_dims, attention, regions), the plan and the rewrite."""
from . import attention, rules  # noqa: F401  (registers the rule families)
from .hoist import move_slices
from .pipeline import Analysis, analyze, decide

__all__ = ["Analysis", "analyze", "decide", "move_slices"]
