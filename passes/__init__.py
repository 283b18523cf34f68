"""Graph passes of streamfx: analyses (seq_dims, attention, regions), the plan and the rewrite.

``pipeline.run`` is the whole pass order; see its module docstring."""
from . import attention, rules  # noqa: F401  (registers the rule families)
from .pipeline import Analysis, analyze, decide, run

__all__ = ["Analysis", "analyze", "decide", "run"]
