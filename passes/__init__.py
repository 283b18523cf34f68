"""Graph passes of streamfx: analyses (seq_dims, attention, regions), the plan and the rewrite.

``pipeline.run`` is the whole pass order; see its module docstring."""

__all__ = ["Analysis", "analyze", "decide", "run"]


def __getattr__(name):  # the pipeline is imported when first used (the runtime imports the policy alone)
    if name in __all__:
        from . import pipeline
        return getattr(pipeline, name)
    raise AttributeError(name)
