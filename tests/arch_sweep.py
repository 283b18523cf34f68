"""One family of the architecture sweep: build the tiny model, run eager autograd and streambp
(eager codegen) on the same batch, compare, and say what streamed and what was said about the rest.

    PYTHONPATH=tests python tests/arch_sweep.py MODEL_TYPE...   # one JSON line per family
    PYTHONPATH=tests python tests/arch_sweep.py --use-cache MODEL_TYPE...   # calls with use_cache=True
    PYTHONPATH=tests python tests/arch_sweep.py --inductor-passes MODEL_TYPE...   # graphs as Inductor's passes leave them
    PYTHONPATH=tests python tests/arch_sweep.py --record OUT.json RESULTS.jsonl...   # the streamed floor

``check(model_type)`` returns a dict: ``status`` ("ok", "skip" with ``reason``, "eager-fails"),
``error`` (an exception that reached the user: none is allowed), ``loss_err`` and ``grad_err``
(relative, against eager autograd), ``layers`` (the model's layer count: entries of a ModuleList that run), ``streamed`` (names of
the regions that streamed), ``kv_latent`` (layers whose K/V graph keeps a latent), ``warnings`` (streamfx's), ``silent`` (layers that did not stream
while streamfx said nothing).
"""
from __future__ import annotations

import copy
import functools
import inspect
import json
import sys
import time
import traceback
import warnings

import torch

import arch_configs

T, B, CHUNK = 12, 2, 5


class _LayerCount:
    """The model's layer count: of each ModuleList, the entries whose forward runs on a text-only
    batch (a vision tower does not run, nor Mllama's cross-attention layers without images); the
    largest such count. Counted during the reference run, with forward hooks."""

    def __init__(self, model):
        self.ran: dict = {}
        self.handles = []
        for m in model.modules():
            if isinstance(m, torch.nn.ModuleList):
                for i, child in enumerate(m):
                    self.handles.append(child.register_forward_hook(
                        lambda *_, key=(id(m), i): self.ran.__setitem__(key, True)))

    def done(self) -> int:
        for h in self.handles:
            h.remove()
        per_list: dict = {}
        for (lst, _) in self.ran:
            per_list[lst] = per_list.get(lst, 0) + 1
        return max(per_list.values(), default=0)


def _grad_error(ref: torch.nn.Module, got: torch.nn.Module) -> float:
    """Max over parameters of max|g - g_ref| / max(max|g_ref|, 1e-3 * the model's largest
    max|g_ref|) (a gradient that is ~0 in truth is compared at the model's scale); inf for a
    missing or non-finite gradient. A zero gradient where eager leaves None counts as equal:
    AOTAutograd (every torch.compile backend) gives an unused parameter zeros."""
    pairs = list(zip(ref.parameters(), got.parameters()))
    top = max((r.grad.abs().max().item() for r, _ in pairs if r.grad is not None), default=0.0)
    err = 0.0
    for r, g in pairs:
        if r.grad is None or g.grad is None:
            if (r.grad is None) != (g.grad is None) and bool((r.grad if g.grad is None else g.grad).any()):
                return float("inf")
            continue
        if not torch.isfinite(g.grad).all():
            return float("inf")
        scale = max(r.grad.abs().max().item(), 1e-3 * top, 1e-30)
        err = max(err, (g.grad.double() - r.grad.double()).abs().max().item() / scale)
    return err


def build(model_type: str):
    """(model, attn) with sdpa attention where the family supports it, else eager (``check`` also
    runs eager attention where eager autograd's own step under sdpa is not finite)."""
    try:
        return arch_configs.build(model_type, "sdpa"), "sdpa"
    except arch_configs.Skip as e:
        if "attn_implementation" not in str(e) and "attention implementation" not in str(e):
            raise
    return arch_configs.build(model_type, "eager"), "eager"


def check(model_type: str, options: dict | None = None, use_cache: bool = False, passes: str | None = None) -> dict:
    """``passes="inductor"``: the graphs go through Inductor's pre-grad and joint-graph passes
    before the analysis, as the default codegen's compile does (the chunk graphs still run as
    FX graphs)."""
    from streamfx.backend import compile_graph
    from streamfx.config import StreamConfig
    from streamfx.session import Session

    out = dict(model_type=model_type, status="ok", error=None, warnings=[], streamed=[], silent=0)
    t0 = time.perf_counter()
    try:
        model, out["attn"] = build(model_type)
    except arch_configs.Skip as e:
        return dict(out, status="skip", reason=str(e))
    batch = arch_configs.inputs(model, B=B, T=T, seed=0, pad="left")
    if use_cache:   # (a training call of a model whose config keeps use_cache=True: a KV cache returned)
        try:
            takes = "use_cache" in inspect.signature(type(model).forward).parameters
        except (TypeError, ValueError):
            takes = False
        if not takes:
            return dict(out, status="skip", reason="forward takes no use_cache")
        batch["use_cache"] = True
    ref, ref_loss, failed = _reference(model, batch, out)
    if failed and out["attn"] == "sdpa" and "not finite" in failed:
        # (SDPA's own backward of a row whose keys are all masked, left padding, is NaN in some
        # families that do not guard it, Dory's: eager attention runs the family there)
        model, out["attn"] = arch_configs.build(model_type, "eager"), "eager"
        ref, ref_loss, failed = _reference(model, batch, out)
    if failed:
        return dict(out, status="eager-fails", reason=failed)
    config = StreamConfig.from_options({"codegen": "eager", "chunk_size": CHUNK, **(options or {})})
    analyses: list = []

    def backend(gm, example_inputs):
        session = Session(config, collect=analyses)
        session.passes_of = passes
        return compile_graph(gm, example_inputs, config, session)

    torch._dynamo.reset()
    mine = copy.deepcopy(model)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = torch.compile(mine, backend=backend)(**batch).loss
            loss.backward()
    except Exception as e:  # noqa: BLE001 - recorded: the test fails on it
        tb = traceback.extract_tb(e.__traceback__)
        ours = [f"{f.filename.split('/')[-1]}:{f.lineno}" for f in tb if "streamfx" in f.filename or "/passes/" in f.filename]
        return dict(out, error=f"{type(e).__name__}: {str(e)[:400]}", where=ours[-3:], seconds=time.perf_counter() - t0)
    out["warnings"] = sorted({str(w.message) for w in caught if str(w.message).startswith("streamfx")})
    out["streamed"] = [p.name for a in analyses for p in a.plans]
    layers_streamed = sum(1 for a in analyses for p in a.plans if p.kind == "layer")
    out["kv_latent"] = [p.name for a in analyses for p in a.plans if getattr(p, "kv_latent", False)]
    out["silent"] = 0 if out["warnings"] else max(out["layers"] - layers_streamed, 0)
    out["loss_err"] = abs(loss.item() - ref_loss.item()) / max(abs(ref_loss.item()), 1e-30)
    out["grad_err"] = _grad_error(ref, mine)
    out["none_differs"] = [n for (n, r), g in zip(ref.named_parameters(), mine.parameters())
                           if (r.grad is None) != (g.grad is None)
                           and bool((r.grad if g.grad is None else g.grad).any())]
    out["seconds"] = time.perf_counter() - t0
    return out


def _reference(model, batch, out: dict):
    """(a copy of the model after eager autograd's step, its loss, None), or (.., .., why the step
    failed or is not finite); ``out["layers"]``: the layers that ran."""
    ref = copy.deepcopy(model)
    count = _LayerCount(ref)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref_loss = ref(**batch).loss
            ref_loss.backward()
    except Exception as e:  # noqa: BLE001 - transformers itself fails on the tiny input
        return ref, None, f"{type(e).__name__}: {str(e)[:200]}"
    finally:
        out["layers"] = count.done()
    bad = [n for n, p in ref.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    if bad or not torch.isfinite(ref_loss):
        return ref, ref_loss, f"eager autograd's loss or gradients are not finite ({bad[:3]})"
    return ref, ref_loss, None


STREAMS = __file__.rsplit("/", 1)[0] + "/arch_streams.json"


def record(out: str, results: list) -> None:
    """Write what each family streamed (from result lines of this script) as the floor the sweep
    holds later runs to, for the installed transformers version."""
    import transformers

    streamed = {}
    for path in results:
        for line in open(path):
            r = json.loads(line)
            if r.get("status") == "ok" and not r.get("error"):
                streamed[r["model_type"]] = sorted(r["streamed"])
    rows = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(streamed.items()))
    with open(out, "w") as f:
        f.write(f'{{"transformers": {json.dumps(transformers.__version__)},\n "streamed": {{\n{rows}\n}}}}\n')


@functools.cache
def _recorded() -> dict:
    with open(STREAMS) as f:
        return json.load(f)


def streams_less(result: dict, floor: dict | None = None) -> list:
    """The regions a family streamed in the recorded run and not in this one (``arch_streams.json``;
    only for the transformers version it was recorded with: another version's models differ)."""
    import transformers

    floor = _recorded() if floor is None else floor
    if floor.get("transformers") != transformers.__version__ or result.get("status") != "ok":
        return []
    return sorted(set(floor["streamed"].get(result["model_type"], ())) - set(result.get("streamed") or ()))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--record"]:
        record(sys.argv[2], sys.argv[3:])
        sys.exit(0)
    torch.set_num_threads(1)
    cache = "--use-cache" in sys.argv[1:]
    passes = "inductor" if "--inductor-passes" in sys.argv[1:] else None
    for name in (a for a in sys.argv[1:] if a not in ("--use-cache", "--inductor-passes")):
        try:
            result = check(name, use_cache=cache, passes=passes)
        except Exception as e:  # noqa: BLE001
            result = dict(model_type=name, error=f"harness: {type(e).__name__}: {e}")
        print(json.dumps(result, default=str), flush=True)
