"""The memory model against measurement: predicted step peaks beside the peak RSS rise of a
step measured in a fresh process per model, at each length after a warm-up step at that length
(``streamfx.bench.memcheck``), and a budget sweep (slow tier)."""
import functools

import pytest

# the tests of the layers preset without options share one trace (its report depends neither on the
# lengths predicted nor on a budget): they run on one worker
LAYERS = "preset:qwen3-layers"
SHARED = pytest.mark.xdist_group("qwen3-layers-report")


@functools.lru_cache(maxsize=None)
def _report(spec):
    """The memory report of a model spec traced without options, once per process."""
    from streamfx.bench import memcheck

    return memcheck.predict(spec, [64])[0]


def _predict(spec, seqs, method="streamfx"):
    if spec != LAYERS:
        from streamfx.bench import memcheck

        return memcheck.predict(spec, seqs, method=method)[1]
    return {T: _report(spec).step_peak(T, method) for T in seqs}


# ---- predicted against measured (fresh processes) ---------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("spec, seqs", [pytest.param(LAYERS, (1024, 2048, 4096), marks=SHARED),
                                        ("preset:qwen3-head", (1024, 2048, 4096)),   # 1, 2 and 4 head chunks
                                        pytest.param("zoo:llama_tied", (2048, 4096), marks=pytest.mark.extended),
                                        ("zoo:mistral_sliding", (2048, 8192))])
def test_predicted_step_peak_within_15_percent_of_measured(spec, seqs):
    from streamfx.bench import memcheck

    predicted = _predict(spec, seqs)
    got = memcheck.measure_in_subprocess(spec, seqs)
    assert "error" not in got, got["error"]
    for T in seqs:
        assert abs(predicted[T] / got[T]["measured"] - 1) <= 0.15, (spec, T, predicted[T], got[T]["measured"])


@pytest.mark.slow
@pytest.mark.parametrize("options", [{"offload": "disk", "keep_every": 3},
                                     pytest.param({"keep_every": 2}, marks=pytest.mark.extended),
                                     pytest.param({"offload": "disk"}, marks=pytest.mark.extended)],
                         ids=["disk-keep3", "keep2", "disk"])
def test_layer_inputs_off_the_device_predicted_within_15_percent_of_measured(options):
    """Layer inputs read back from files and rebuilt by keep_every are held outside the graphs'
    saved tensors (``streamfx.offload``): the model counts them, with the working sets of the
    layers that store them and of the rebuild, where the step holds them."""
    from streamfx.bench import memcheck

    spec, T = "preset:qwen3-layers", 4096
    _, predicted = memcheck.predict(spec, [T], options)
    got = memcheck.measure_in_subprocess(spec, [T], options)
    assert "error" not in got, got["error"]
    assert abs(predicted[T] / got[T]["measured"] - 1) <= 0.15, (options, predicted[T], got[T]["measured"])


@pytest.mark.slow
@pytest.mark.extended
def test_kept_attention_predicted_within_15_percent_of_measured():
    """attention="keep": every layer's attention output and log-sum-exp, region op outputs held
    from the forward to the layer's backward, are in the step's peak as predicted."""
    from streamfx.bench import memcheck

    spec, T, options = "preset:qwen3-layers", 4096, {"attention": "keep"}
    _, predicted = memcheck.predict(spec, [T], options)
    got = memcheck.measure_in_subprocess(spec, [T], options)
    assert "error" not in got, got["error"]
    plain = _predict(spec, [T])
    assert predicted[T] > plain[T], (predicted[T], plain[T])
    assert abs(predicted[T] / got[T]["measured"] - 1) <= 0.15, (predicted[T], got[T]["measured"])


@pytest.mark.slow
@pytest.mark.parametrize("spec", [pytest.param(LAYERS, marks=SHARED), pytest.param("preset:qwen3-head", marks=pytest.mark.extended)])
def test_checkpointing_prediction_within_15_percent_of_measured(spec):
    """The baseline a user compares against, predicted from the same graph: HF gradient
    checkpointing (eager, no attention mask) measured in a fresh process."""
    from streamfx.bench import memcheck

    method, T = "activation checkpointing", 4096
    predicted = _predict(spec, [T], method)
    got = memcheck.measure_in_subprocess(spec, T, method=method)
    assert "error" not in got, got["error"]
    assert abs(predicted[T] / got[T]["measured"] - 1) <= 0.15, (spec, T, predicted[T], got[T]["measured"])


@pytest.mark.slow
@SHARED
def test_budget_sweep_stays_under_budget_and_chunks_grow():
    """Per budget, one compile runs a sweep of lengths (the run-time policy picks each call's
    chunks): every step's peak stays under the budget, and chunks grow with the budget."""
    from streamfx.bench import memcheck

    spec, seqs = LAYERS, (2048, 4096)
    report = _report(spec)   # (the trace does not depend on the budget)
    chunks = {}
    # (at 4096: layer chunks of 1,024 under 100 MiB, 95 MiB predicted with the parameters; 2,048 under 130)
    for mib in (100, 130):
        got = memcheck.measure_in_subprocess(spec, seqs, {"memory_budget": f"{mib}MiB"})
        assert "error" not in got, got["error"]
        for T in seqs:
            assert got[T]["measured"] + got[T]["params"] <= 1.05 * mib * 2**20, (mib, got)
        chunks[mib] = [report.chunks(T, mib * 2**20) for T in seqs]
    small, large = chunks[100], chunks[130]   # (layer, head) chunk sizes per length
    assert all(x <= y for a, b in zip(small, large) for x, y in zip(a, b)) and small[-1] != large[-1], chunks


@pytest.mark.fast
def test_a_wide_zoo_model_leaves_the_zoo_as_it_was():
    """memcheck builds zoo models wider and longer than the tests' own; the test process that
    predicts with it shares ``zoo``, whose later models must keep their own sizes."""
    import zoo
    from streamfx.bench import memcheck

    before = zoo.HIDDEN, zoo.HEAD_DIM, zoo.MAX_POS
    model, ids, _ = memcheck.build("zoo:llama_tied", 4 * zoo.MAX_POS)
    assert model.config.hidden_size == memcheck.WIDE_HIDDEN and ids.shape[1] == 4 * before[2]
    assert (zoo.HIDDEN, zoo.HEAD_DIM, zoo.MAX_POS) == before
