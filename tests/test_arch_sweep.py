"""Every causal-LM class of the installed transformers, built from a tiny config on CPU, through
``streambp`` (eager codegen, B=2, T=12, the last row left-padded, chunks of 5): no exception
reaches the user, gradients equal eager autograd's, and every layer that did not stream was
warned about. Families run in shards (``SHARDS``); ``pytest -m sweep``.

The user's contract is tested: ``STREAMFX_VERIFY`` is off, so a pass failure becomes an
unstreamed run with a warning (as for users) rather than an error.

``KNOWN`` lists the families that do not meet the contract yet, each with its cause; they run
as strict xfails (one that starts to pass fails the shard until it is taken off the list).

``arch_streams.json`` records which regions each family streamed in a run of the whole sweep;
with the transformers version it was recorded with, a family that streams fewer fails (a change
that makes a model run unstreamed, warned and exact, still loses its memory: regenerate the record
with ``arch_sweep.py --record`` where a family rightly streams less).
"""
import functools
import time

import pytest

import arch_configs
import arch_sweep

SHARDS = 12
KNOWN: dict = {
    # none at present; an entry is "model_type": "the cause"
}


@functools.cache
def families() -> list:
    """The model types of every causal-LM class (found when a shard runs, not at collection:
    building the 196 classes' configs takes seconds, which every run of the suite would pay)."""
    try:
        return sorted(m for m, _, _ in arch_configs.causal_lm_classes())
    except Exception:  # noqa: BLE001 - transformers without the auto mappings
        return []


def failures(result: dict) -> list:
    """What a family's result breaks of the contract (empty: nothing)."""
    if result.get("status") in ("skip", "eager-fails"):
        return []
    bad = []
    if result.get("error"):
        bad.append(f"exception: {result['error']} {result.get('where', '')}")
        return bad
    if not result["loss_err"] <= 1e-5:
        bad.append(f"loss error {result['loss_err']:.2e}")
    if result.get("none_differs"):
        bad.append(f"a gradient is None in one run and not the other: {result['none_differs'][:3]}")
    elif not result["grad_err"] <= 1e-4:
        bad.append(f"gradient error {result['grad_err']:.2e}")
    if result["silent"]:
        bad.append(f"{result['silent']} layer(s) did not stream and nothing was said")
    return bad


@pytest.mark.sweep
@pytest.mark.parametrize("shard", range(SHARDS))
def test_arch_sweep(shard, monkeypatch, capsys):
    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    assert families(), "no causal-LM classes found in transformers"
    names = families()[shard::SHARDS]
    start, broken, fixed, lines = time.perf_counter(), {}, [], []
    for name in names:
        result = arch_sweep.check(name)
        bad = failures(result)
        less = arch_sweep.streams_less(result)
        if less:
            bad.append(f"streams less than the recorded run (arch_streams.json): {less} no longer stream")
        lines.append(f"{name}: {result.get('status')} {result.get('seconds', 0):.1f}s streamed {result.get('streamed')}"
                     + (f" FAIL {bad}" if bad else ""))
        if bad and name not in KNOWN:
            broken[name] = bad
        elif not bad and name in KNOWN and result.get("status") == "ok":
            fixed.append(name)
    with capsys.disabled():
        print(f"\nshard {shard}: {len(names)} families in {time.perf_counter() - start:.0f}s")
        for line in lines:
            print("  " + line)
    assert not broken, broken
    assert not fixed, f"now meet the contract, take them off KNOWN: {fixed}"


@pytest.mark.fast
def test_a_family_that_streams_less_than_recorded_is_a_failure():
    import transformers

    floor = {"transformers": transformers.__version__, "streamed": {"m": ["head", "layer.0", "layer.1"]}}
    ran = {"model_type": "m", "status": "ok", "streamed": ["layer.0", "layer.1"]}
    assert arch_sweep.streams_less(ran, floor) == ["head"]
    assert arch_sweep.streams_less(dict(ran, streamed=["head", "layer.0", "layer.1", "layer.2"]), floor) == []
    assert arch_sweep.streams_less(ran, dict(floor, transformers="0.0")) == []   # another version's models
    assert arch_sweep.streams_less(dict(ran, model_type="other"), floor) == []
