"""DeepSpeed ZeRO-2 and ZeRO-3 on 2 CPU ranks (``DS_ACCELERATOR=cpu``, gloo), each test launching
its own processes. Each rank computes its half of a global batch through the engine compiled
with ``backend="streambp"``; the full gradients after one backward (``safe_get_full_grad``) must
equal single-process eager autograd's over the global batch, each parameter is reduced once, and
the streamed regions are counted.
Under ZeRO-3 the decoder layers are leaf modules (``set_z3_leaf_modules``): their parameters are
gathered once per layer, outside the layer's graph. ``streamfx.zero3.stream_head`` keeps a Hugging
Face model's LM head in its loss's graph under ZeRO-3."""
import os
import warnings

import pytest
import torch

import zoo
from conftest import assert_grads_match
from test_distributed import CASE, OPTIONS, WORLD, eager_grads, finish, init_ranks, launch

try:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # noqa: F401
    MISSING = None
except ImportError as err:  # not installed: .ci/setup installs it (its CPU comm op compiled at install)
    MISSING = f"deepspeed is not importable: {err}"


def _worker(rank, rendezvous, mode, out):
    # DeepSpeed's init_distributed looks for the launcher's variables (else it tries MPI discovery)
    # before it adopts the group already joined; the ranks meet through init_ranks' file store, and
    # nothing listens on MASTER_PORT
    # (set before deepspeed is imported: it picks its accelerator then; init_ranks sets the rest)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", LOCAL_RANK=str(rank), DS_ACCELERATOR="cpu")
    import deepspeed
    import torch.distributed as dist
    from deepspeed.utils import safe_get_full_grad, set_z3_leaf_modules

    from streamfx.runtime import COUNTERS

    init_ranks(rank, rendezvous)
    deepspeed.init_distributed(dist_backend="gloo")  # adopts the process group
    try:
        if mode == "zero3_hf_head":
            from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

            model, make_inputs = zoo.qwen3()
            batch = {k: v[rank:rank + 1] for k, v in make_inputs(CASE).kwargs.items()}
            leaf = Qwen3DecoderLayer
        else:
            model, make_inputs = zoo.tiny_llama()
            ids, labels = make_inputs(CASE).args
            batch = {"idx": ids[rank:rank + 1], "labels": labels[rank:rank + 1]}
            leaf = zoo.LlamaBlock
        stage = 2 if mode == "zero2" else 3
        if stage == 3:
            set_z3_leaf_modules(model, [leaf])
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        moved = []
        if mode == "zero3_hf_head":
            import streamfx.zero3

            moved = streamfx.zero3.stream_head(engine)
        # one reduction per parameter per step: ZeRO-2's and ZeRO-3's gradient hooks hand each
        # parameter to this method once its gradient is complete (it buckets and reduces it)
        names, reduced = {id(p): n for n, p in engine.module.named_parameters()}, []
        reduce = engine.optimizer.reduce_ready_partitions_and_remove_grads

        def counting(param, *args):
            reduced.append(names[id(param)])
            return reduce(param, *args)

        engine.optimizer.reduce_ready_partitions_and_remove_grads = counting
        engine.compile(backend="streambp", compile_kwargs={"options": OPTIONS})
        before = dict(COUNTERS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out_ = engine(**batch)
            loss = out_.loss if hasattr(out_, "loss") else out_[0]
            engine.backward(loss)
        messages = [str(w.message) for w in caught if "streamfx" in str(w.message)]
        ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
        grads = {n: safe_get_full_grad(p).detach().clone() for n, p in engine.module.named_parameters()}
        torch.save({"ran": ran, "grads": grads, "loss": loss.detach(), "messages": messages, "moved": moved,
                    "reduced": reduced, "names": sorted(names.values())},
                   f"{out}/rank{rank}.pt")
        finish()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
@pytest.mark.parametrize("mode", ["zero2", "zero3"])
def test_deepspeed_zero(tmp_path, mode):
    results = launch(mode, tmp_path, _worker)
    ref = eager_grads()
    # ZeRO-2 keeps the module whole: one graph, every layer and the head stream. ZeRO-3's
    # compiler-disabled fetch hooks on the final norm and the LM head cut them and the loss apart
    # (no graph holds the head with its loss), so only the leaf layers stream, as under FSDP2,
    # and Dynamo runs the model's forward (its norm, head and loss) eagerly: one warning names it.
    # T=24 runs in 3 chunks of 8.
    regions = {"zero2": zoo.LAYERS + 1, "zero3": zoo.LAYERS}[mode]
    for res in results:
        assert_grads_match(ref, res["grads"], rtol=1e-5)
        ran = res["ran"]
        assert ran["region_forward"] == regions and ran["region_backward"] == regions, ran
        assert ran["chunks_backward"] == regions * 3, ran
        assert sorted(res["reduced"]) == res["names"], res["reduced"]  # each parameter once
        skipped = [m for m in res["messages"] if m.startswith("streamfx: Dynamo runs") and "TinyLlama.forward" in m]
        assert len(skipped) == (mode == "zero3") == len(res["messages"]), res["messages"]


def _hf_eager_grads():
    model, make_inputs = zoo.qwen3()
    kwargs = make_inputs(CASE).kwargs
    loss = sum(model(**{k: v[r:r + 1] for k, v in kwargs.items()}).loss for r in range(WORLD)) / WORLD
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_deepspeed_zero3_hf_head_streams(tmp_path):
    """A Hugging Face model under ZeRO-3 with ``streamfx.zero3.stream_head``: the LM head is
    gathered with the root module, so no hook cuts it from its loss; the head streams with its
    projection (no "logits arrive as an input" caveat, which a loss over whole logits gives), every
    leaf layer streams, gradients equal eager's over the global batch."""
    results = launch("zero3_hf_head", tmp_path, _worker)
    ref = _hf_eager_grads()
    for res in results:
        assert res["moved"] == ["lm_head.weight"], res["moved"]
        assert sorted(res["reduced"]) == res["names"], res["reduced"]  # each parameter once
        assert_grads_match(ref, res["grads"], rtol=1e-5)
        ran = res["ran"]
        assert ran["region_forward"] == zoo.LAYERS + 1 and ran["region_backward"] == zoo.LAYERS + 1, ran
        assert ran["chunks_backward"] == (zoo.LAYERS + 1) * 3, ran
        assert not [m for m in res["messages"] if "arrive as an input" in m], res["messages"]
        # the rest of the base model's forward (after its loop over hooked layers: the final norm)
        # runs eagerly, and is named
        assert len(res["messages"]) == 1 and "Dynamo runs the rest of Qwen3Model.forward" in res["messages"][0], \
            res["messages"]


@pytest.mark.fast
def test_stream_head_refuses_what_it_cannot_do():
    import streamfx  # streamfx.zero3 loads on first use

    model, _ = zoo.tiny_llama()
    with pytest.raises(streamfx.StreamBPError, match="not partitioned by DeepSpeed ZeRO-3"):
        streamfx.zero3.stream_head(model)
    for p in model.parameters():
        p.ds_id = 0  # marked as ZeRO-3's, as deepspeed.initialize does
    with pytest.raises(streamfx.StreamBPError, match="get_output_embeddings"):
        streamfx.zero3.stream_head(model)
    with pytest.raises(streamfx.StreamBPError, match="submodule of the model"):
        streamfx.zero3.stream_head(model, head=torch.nn.Linear(2, 2))
    with pytest.raises(streamfx.StreamBPError, match="expects a DeepSpeed engine"):
        streamfx.zero3.stream_head(object())
