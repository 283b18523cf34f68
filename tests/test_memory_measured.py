"""The memory model against measurement: predicted step peaks beside the peak RSS rise of a
step measured in fresh processes (``streamfx.bench.memcheck``), and a budget sweep (slow tier)."""
import pytest


# ---- predicted against measured (fresh processes) ---------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("spec, seqs", [("preset:qwen3-layers", (1024, 4096)),
                                        ("preset:qwen3-head", (1024, 4096)),   # one head chunk; four
                                        ("zoo:llama_tied", (2048, 4096)),
                                        ("zoo:mistral_sliding", (2048, 8192))])
def test_predicted_step_peak_within_15_percent_of_measured(spec, seqs):
    from streamfx.bench import memcheck

    report, predicted = memcheck.predict(spec, seqs)
    for T in seqs:
        got = memcheck.measure_in_subprocess(spec, T)
        assert "measured" in got, got.get("error")
        assert abs(predicted[T] / got["measured"] - 1) <= 0.15, (spec, T, predicted[T], got["measured"])


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["preset:qwen3-layers", pytest.param("preset:qwen3-head", marks=pytest.mark.extended)])
def test_checkpointing_prediction_within_15_percent_of_measured(spec):
    """The baseline a user compares against, predicted from the same graph: HF gradient
    checkpointing (eager, no attention mask) measured in a fresh process."""
    from streamfx.bench import memcheck

    method, T = "activation checkpointing", 4096
    _, predicted = memcheck.predict(spec, [T], method=method)
    got = memcheck.measure_in_subprocess(spec, T, method=method)
    assert "measured" in got, got.get("error")
    assert abs(predicted[T] / got["measured"] - 1) <= 0.15, (spec, T, predicted[T], got["measured"])


@pytest.mark.slow
def test_budget_sweep_stays_under_budget_and_chunks_grow():
    from streamfx.bench import memcheck

    spec, T = "preset:qwen3-layers", 8192
    chunks = []
    for mib in (160, 320):
        options = {"memory_budget": f"{mib}MiB"}
        report, _ = memcheck.predict(spec, [T], options)
        got = memcheck.measure_in_subprocess(spec, T, options)
        assert got["measured"] + got["params"] <= 1.05 * mib * 2**20, got
        chunks.append(report.chunks(T))
    assert chunks[0] < chunks[1]


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
