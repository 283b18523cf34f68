"""The default run and the extended tier.

A test parametrized over a product of models, forms, chunk sizes or data kinds runs a chosen
part of it by default, every capability with at least one case; the other cases carry the
``extended`` mark and run when asked for (``python -m pytest -m extended``), so that the
default run (what CI runs) stays within its time."""
from __future__ import annotations

import os

import pytest

# property tests run this many times their default number of examples (a deeper run:
# STREAMFX_EXAMPLES=4 python -m pytest -k property)
SCALE = float(os.environ.get("STREAMFX_EXAMPLES", "1"))


def examples(n: int) -> int:
    """A property test's number of examples: ``n`` by default, scaled by ``STREAMFX_EXAMPLES``."""
    return max(1, round(n * SCALE))


def compiling(n: int):
    """Hypothesis settings of a property test whose every example compiles a model:
    ``examples(n)`` generated examples, derandomized, no deadline, no shrinking."""
    from hypothesis import HealthCheck, Phase, settings

    return settings(max_examples=examples(n), deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), phases=(Phase.explicit, Phase.reuse, Phase.generate))


def cases(values, default, fast=None) -> list:
    """``values`` as parameters: those in ``default`` run by default, the rest are ``extended``;
    with ``fast`` given, the default cases not in it are ``heavy`` (left out of the fast tier).
    A value is one argument or, for several argument names, a tuple of them."""
    default = list(default)
    missing = [d for d in [*default, *(fast or ())] if d not in values]
    if missing:
        raise ValueError(f"default or fast cases {missing} are not among {list(values)}")
    out = []
    for v in values:
        args = v if isinstance(v, tuple) else (v,)
        if v not in default:
            out.append(pytest.param(*args, marks=pytest.mark.extended))
        elif fast is not None and v not in fast:
            out.append(pytest.param(*args, marks=pytest.mark.heavy))
        else:
            out.append(pytest.param(*args))
    return out
