"""Logging calls inside compiled code cost no graph break.

Dynamo cannot trace a ``logging.Logger`` method: each call inside a model breaks the graph there.
transformers' ``loss_function`` property calls ``logger.warning_once`` on every forward of a
model that sets no ``loss_type`` (GPT-2): the LM head and the loss then land in two graphs, and
the head's logits exist for the whole sequence between them. Torch's
``torch._dynamo.config.ignore_logging_functions`` makes such calls no-ops in traced code (they do
not run, and nothing breaks). streamfx adds transformers' once-per-process Logger methods to it
when it is loaded as a backend (``torch.compile(..., backend="streambp")`` loads it before Dynamo
traces; transformers, imported to build the model, has added ``warning_once`` by then). It is
never changed from inside a compile: on torch 2.11 that hides the functions Dynamo skipped from
``streamfx.frames``. Every other logging call is left alone: it breaks the graph and runs, as
under any backend.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys

import torch

# transformers' once-per-process messages (it adds them to ``logging.Logger``): skipping them in
# traced code hides nothing a user relies on; a model's own ``logger.info`` / ``warning`` calls
# keep running (and breaking the graph), as under any other backend
METHODS = ("warning_once", "info_once")


def ignore_logging_calls() -> None:
    """Add the ``METHODS`` of ``logging.Logger`` that exist now to Dynamo's ignored logging
    functions (idempotent)."""
    config = torch._dynamo.config
    methods = {getattr(logging.Logger, m) for m in METHODS if hasattr(logging.Logger, m)}
    if not methods <= set(config.ignore_logging_functions):
        config.ignore_logging_functions = set(config.ignore_logging_functions) | methods
        _config_logged_with_functions()


def _config_logged_with_functions() -> None:
    """Dynamo records every compile's metrics (``torch._dynamo.utils.compilation_metrics``,
    which ``streamfx.frames`` reads) with its config as JSON, sorting each set in it. Torch 2.11
    sorts ``ignore_logging_functions`` too (later versions leave it out): two functions in it do
    not compare, the record fails and nothing of the compile is recorded. Where that is so, the
    config is recorded with such sets' items as their reprs."""
    import json

    utils = torch._dynamo.utils
    original = getattr(utils, "_get_dynamo_config_for_logging", None)
    if original is None or getattr(original, "_streamfx", False):
        return
    try:
        original()
        return
    except TypeError:
        pass

    def config_for_logging():
        try:
            return original()
        except TypeError:
            d = torch._dynamo.config.get_config_copy()
            return json.dumps({k: sorted(map(repr, v)) if isinstance(v, set) else v for k, v in d.items()},
                              sort_keys=True, default=repr)

    config_for_logging._streamfx = True
    utils._get_dynamo_config_for_logging = config_for_logging


def install() -> None:
    """Ignore the logging methods that exist now (when streamfx is loaded as a backend; the
    config outlives ``torch._dynamo.reset()``), and, when transformers is imported after
    streamfx (``import streamfx`` first), those its logging module adds, as soon as it has run.
    No Dynamo callback sets it again during a compile: on torch 2.11 a config change from inside
    a compile hides the functions Dynamo skipped from ``streamfx.frames``."""
    ignore_logging_calls()
    if TRANSFORMERS_LOGGING not in sys.modules and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


TRANSFORMERS_LOGGING = "transformers.utils.logging"   # where ``warning_once`` joins ``logging.Logger``


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when transformers' logging module is imported, it wraps that
    module's loader so the methods it adds to ``logging.Logger`` are ignored once it has run
    (an import, outside any compile), then leaves the import system."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TRANSFORMERS_LOGGING:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            ignore_logging_calls()

        spec.loader.exec_module = exec_module
        return spec
