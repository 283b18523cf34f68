"""streambp in the trainers people run: HF Trainer, accelerate, TRL's SFT/DPO/GRPO trainers, PEFT.

Each trainer runs twice from the same seed on the same data: as it is (TRL's own fused-head kernel,
gradient checkpointing as the trainer sets it) and with ``callbacks=[streamfx.StreamBPCallback()]``.
Asserted: the loss of every step and the final weights agree (fp32, SGD so weight differences are
gradient differences), every training step ran the layers and the head as streamed regions
forward and backward, no graph the rewrite produced holds a ``[B, T, V]`` value, and the number
of compiles. The mixed-length tests assert what the issue asks for (one static compile for the
first shape, one symbolic compile for every later one, all streamed); see their docstrings.
"""
from __future__ import annotations

import collections
import contextlib
import inspect
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")
pytest.importorskip("accelerate")

import streamfx  # noqa: E402
from conftest import at_chunk_size  # noqa: E402
from streamfx import trainers as sfx_trainers  # noqa: E402  (importing it installs accelerate's hint)
from streamfx.runtime import COUNTERS, LayerProgram, RegionProgram, _PROGRAMS  # noqa: E402

V, D, LAYERS, HEAD_CHUNK, LAYER_CHUNK = 96, 32, 2, 4, 8
OPTIONS = {"codegen": "eager", "head_chunk_size": HEAD_CHUNK, "chunk_size": LAYER_CHUNK}
STREAMED = {"head", *(f"layer.{i}" for i in range(LAYERS))}
WORDS = [f"w{i}" for i in range(V - 6)]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- tiny model, tokenizer, data ---------------------------------------------------------------
def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def tiny_model(dtype=torch.float32):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=V, hidden_size=D, intermediate_size=64, num_hidden_layers=LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
                      pad_token_id=0, eos_token_id=1, bos_token_id=None)
    cfg._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(cfg).to(dtype)


def texts(n, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[j] for j in torch.randint(0, len(WORDS), (lengths[i % len(lengths)],), generator=g).tolist())
            for i in range(n)]


def text_dataset(n=16, lengths=(15,)):
    from datasets import Dataset

    return Dataset.from_dict({"text": texts(n, list(lengths))})


def preference_dataset(n=8, prompt=6, completion=5):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": texts(n, [prompt], seed=1),
                              "chosen": [" " + t for t in texts(n, [completion], seed=2)],
                              "rejected": [" " + t for t in texts(n, [completion], seed=3)]})


def prompt_dataset(n=16, lengths=(5,)):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": texts(n, list(lengths), seed=1)})


def even_words(completions, **kwargs):
    """GRPO reward: how many words of the completion have an even index."""
    return [float(sum(int(w[1:]) % 2 == 0 for w in c.split() if w[1:].isdigit())) for c in completions]


def common_args(**kw):
    return dict(output_dir=kw.pop("output_dir"), max_steps=kw.pop("max_steps", 3), logging_steps=1, report_to=[],
                use_cpu=True, save_strategy="no", learning_rate=0.1, optim="sgd", disable_tqdm=True, seed=0,
                data_seed=0, **kw)


# ---- what ran ------------------------------------------------------------------------------------
class Record:
    """Per training step: the region programs (by name) that ran forward and backward, and the
    loss the trainer logged. Programs registered during the run, for the graph checks."""

    def __init__(self):
        self.current = None
        self.steps: list[dict] = []
        self.losses: list[float] = []
        self.joints: list = []
        self.program_keys: set = set()

    def programs(self):
        return [_PROGRAMS[k] for k in sorted(self.program_keys) if k in _PROGRAMS]


@contextlib.contextmanager
def recording(monkeypatch):
    """Record region calls per step (patched RegionProgram/LayerProgram forward and backward) and
    every joint graph the rewrite produced (patched ``pipeline.stream_joint``)."""
    import streamfx.session as session

    rec = Record()
    # (a head that computes its gradients in the forward runs forward_with_grads, then scale_grads)
    for cls, method, kind in [(RegionProgram, "forward", "forward"), (RegionProgram, "backward", "backward"),
                              (RegionProgram, "forward_with_grads", "forward"),
                              (RegionProgram, "scale_grads", "backward"),
                              (LayerProgram, "forward", "forward"), (LayerProgram, "backward", "backward")]:
        original = cls.__dict__[method]

        def spy(self, *args, _original=original, _kind=kind, **kwargs):
            if rec.current is not None:
                rec.current[_kind].append(self.name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, method, spy)
    from streamfx.passes import pipeline

    stream_joint = pipeline.stream_joint

    def capture(*args, **kwargs):
        out = stream_joint(*args, **kwargs)
        rec.joints.append(out.joint)
        rec.program_keys.update(prog.key for _, prog in out.programs if isinstance(prog, RegionProgram))
        return out

    monkeypatch.setattr(pipeline, "stream_joint", capture)
    partition = session.Session.partition

    def partition_spy(self, *args, **kwargs):  # a joint dropped for a retrace (logits detached) never runs
        n = len(rec.joints)
        try:
            return partition(self, *args, **kwargs)
        except session.DetachOutputs:
            del rec.joints[n:]
            raise

    monkeypatch.setattr(session.Session, "partition", partition_spy)
    yield rec


def recorder_callback(rec: Record):
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            rec.current = {"forward": [], "backward": []}

        def on_step_end(self, args, state, control, **kwargs):
            rec.steps.append(rec.current)
            rec.current = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                rec.losses.append(float(logs["loss"]))

    return Steps()


class Losses:
    def __init__(self):
        from transformers import TrainerCallback

        outer = self
        self.values: list[float] = []

        class _CB(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "loss" in logs:
                    outer.values.append(float(logs["loss"]))

        self.callback = _CB()


def train_pair(monkeypatch, build, *, options=None, dynamic=None):
    """``build(callbacks) -> trainer``, run without and with streambp. Returns (reference losses,
    reference weights, record, streamed trainer, warnings of the streamed run)."""
    torch._dynamo.reset()
    ref_losses = Losses()
    ref = build([ref_losses.callback])
    ref.train()
    ref_weights = {n: p.detach().clone() for n, p in ref.model.named_parameters()}
    with recording(monkeypatch) as rec, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = build([recorder_callback(rec),
                         streamfx.StreamBPCallback(dynamic=dynamic, **(options or OPTIONS))])
        trainer.train()
    messages = [str(w.message) for w in caught if "streamfx" in str(w.message)]
    return ref_losses.values, ref_weights, rec, trainer, messages


def assert_same_training(ref_losses, ref_weights, rec, trainer, rtol=1e-5):
    assert len(rec.losses) == len(ref_losses) > 0, (rec.losses, ref_losses)
    torch.testing.assert_close(torch.tensor(rec.losses), torch.tensor(ref_losses), rtol=rtol, atol=1e-6)
    weights = {n: p.detach() for n, p in trainer.model.named_parameters()}
    assert weights.keys() == ref_weights.keys()
    for n, ref in ref_weights.items():
        err = ((weights[n] - ref).abs().max() / ref.abs().max().clamp(min=1e-12)).item()
        assert err <= rtol, f"{n}: final weights differ by {err:.2e} (relative)"


def assert_every_step_streamed(rec, steps=None, expect=STREAMED):
    assert rec.steps, "no training step was recorded"
    if steps is not None:
        assert len(rec.steps) == steps, len(rec.steps)
    for i, step in enumerate(rec.steps, 1):
        for kind in ("forward", "backward"):
            missing = expect - set(step[kind])
            assert not missing, f"step {i}: {sorted(missing)} did not run streamed {kind}; ran {step[kind]}"


def assert_no_whole_logits(rec, max_rows):
    """No value of the graphs that run (the rewritten joints and every chunk graph) is
    vocabulary-wide with more than ``max_rows`` x head_chunk_size rows, parameters aside."""
    assert rec.joints, "the rewrite produced no graph"
    programs = rec.programs()
    assert any(p.name == "head" for p in programs), [p.name for p in programs]
    # chunk graphs have symbolic chunk lengths: their values at the head's chunk size (layer
    # graphs at theirs); a symbolic joint is read at the sizes it was first run with (hints)
    graphs = [j.graph for j in rec.joints]
    graphs += [at_chunk_size(p.chunk, HEAD_CHUNK if p.name == "head" else LAYER_CHUNK).graph for p in programs]
    graphs += [at_chunk_size(p.kv, LAYER_CHUNK).graph for p in programs if getattr(p, "kv", None) is not None]
    checked = 0
    for graph in graphs:
        for n in graph.nodes:
            vals = n.meta.get("val")
            for v in vals if isinstance(vals, (tuple, list)) else [vals]:
                if not isinstance(v, torch.Tensor):
                    continue
                shape = tuple(_hint(s) for s in v.shape)
                if V in shape and shape not in ((V, D), (D, V), (V,)):
                    numel = 1
                    for s in shape:
                        numel *= s
                    assert numel <= max_rows * HEAD_CHUNK * V, (n.name, n.target, shape)
                    checked += 1
    assert checked, "no vocabulary-wide value was found: the check checked nothing"


def _hint(size) -> int:
    """A size as a number: a symbolic size's value in the run it was traced for."""
    return size if isinstance(size, int) else size.node.hint


def state(trainer):
    st = streamfx.state_of(trainer.model)
    assert st is not None, "the trainer's model was not prepared by StreamBPCallback"
    return st


# ---- TRL SFT ---------------------------------------------------------------------------------------
def sft_builder(tmp_path, dataset, **kw):
    from trl import SFTConfig, SFTTrainer

    tok = tokenizer()
    kw.setdefault("bf16", False)

    def build(callbacks):
        args = SFTConfig(**common_args(output_dir=str(tmp_path), per_device_train_batch_size=2, **kw))
        return SFTTrainer(model=tiny_model(), args=args, train_dataset=dataset, processing_class=tok,
                          callbacks=callbacks)

    return build


def test_sft_padded(monkeypatch, tmp_path):
    """SFTTrainer with its defaults (gradient checkpointing on, TRL's fused LM head): same losses
    and weights; layers and head stream every step; one compile; checkpointing switched off with
    a note; no [B, T, V] value."""
    build = sft_builder(tmp_path, text_dataset(), max_length=64)
    ref_losses, ref_weights, rec, trainer, messages = train_pair(monkeypatch, build)
    assert_same_training(ref_losses, ref_weights, rec, trainer)
    assert_every_step_streamed(rec, steps=3)
    assert_no_whole_logits(rec, max_rows=2)
    st = state(trainer)
    assert st.trl_head and st.compiles == 1, st
    assert not trainer.model.is_gradient_checkpointing
    assert any("gradient checkpointing is switched off" in m for m in messages), messages
    assert not any("not streamed" in m or "ran no streamed region" in m for m in messages), messages


@pytest.mark.parametrize("mode", ["packed", pytest.param("padding_free", marks=pytest.mark.extended)])
def test_sft_packed_and_padding_free(monkeypatch, tmp_path, mode):
    """Packed (BFD) and padding-free batches: one row of documents told apart by position_ids."""
    kw = {"packing": True, "max_length": 32} if mode == "packed" else {"padding_free": True, "max_length": None}
    build = sft_builder(tmp_path, text_dataset(), max_steps=2, **kw)
    ref_losses, ref_weights, rec, trainer, messages = train_pair(monkeypatch, build)
    assert_same_training(ref_losses, ref_weights, rec, trainer)
    assert_every_step_streamed(rec, steps=2)
    assert_no_whole_logits(rec, max_rows=1)
    assert state(trainer).compiles == 1


def test_prepare_before_a_trl_trainer(monkeypatch, tmp_path):
    """``streamfx.prepare(model)`` before the trainer is built (the accelerate line, used with TRL):
    TRL installs its fused head afterwards; the first call replaces it and compiles once."""
    from trl import SFTConfig, SFTTrainer

    torch._dynamo.reset()
    model = streamfx.prepare(tiny_model(), **OPTIONS)
    with recording(monkeypatch) as rec:
        args = SFTConfig(**common_args(output_dir=str(tmp_path), bf16=False, per_device_train_batch_size=2,
                                       max_steps=2, max_length=64))
        trainer = SFTTrainer(model=model, args=args, train_dataset=text_dataset(), processing_class=tokenizer(),
                             callbacks=[recorder_callback(rec)])
        trainer.train()
    assert_every_step_streamed(rec, steps=2)
    assert_no_whole_logits(rec, max_rows=2)
    st = state(trainer)
    assert st.trl_head and st.compiles == 1, st


def test_sft_gradient_accumulation_and_eval(monkeypatch, tmp_path):
    """Gradient accumulation (the loss divides by num_items_in_batch) and evaluation after every
    step: the evaluation forward (no_grad, eval mode) runs the streamed graph compiled for eval
    mode with gradients switched on at the call: 2 compiles in all, not one per step."""
    eval_ds = text_dataset(4)
    from trl import SFTConfig, SFTTrainer

    tok = tokenizer()

    def build(callbacks):
        args = SFTConfig(**common_args(output_dir=str(tmp_path), bf16=False, per_device_train_batch_size=2,
                                       max_steps=2, gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=1,
                                       per_device_eval_batch_size=2, max_length=64))
        return SFTTrainer(model=tiny_model(), args=args, train_dataset=text_dataset(), eval_dataset=eval_ds,
                          processing_class=tok, callbacks=callbacks)

    ref_losses, ref_weights, rec, trainer, messages = train_pair(monkeypatch, build)
    assert_same_training(ref_losses, ref_weights, rec, trainer)
    assert_every_step_streamed(rec, steps=2)
    for step in rec.steps:  # two micro-batches per step
        assert collections.Counter(step["backward"])["head"] == 2, step
    st = state(trainer)
    assert st.compiles == 2 and st.no_grad_calls >= 2 * 2, st


# ---- TRL DPO ---------------------------------------------------------------------------------------
def dpo_builder(tmp_path, peft=False, dataset=None, **kw):
    from trl import DPOConfig, DPOTrainer

    tok = tokenizer()
    dataset = dataset if dataset is not None else preference_dataset()

    def build(callbacks):
        extra = {}
        if peft:
            from peft import LoraConfig

            extra["peft_config"] = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        else:
            extra["ref_model"] = tiny_model()
        args = DPOConfig(**common_args(output_dir=str(tmp_path), bf16=False, per_device_train_batch_size=2, **kw))
        return DPOTrainer(model=tiny_model(), args=args, train_dataset=dataset, processing_class=tok,
                          callbacks=callbacks, **extra)

    return build


def test_dpo_peft_lora(monkeypatch, tmp_path):
    """DPO with LoRA on q/k/v/o and no reference model: the reference log-probs come from the same
    model with the adapter switched off, under no_grad, with checkpointing toggled around them.
    Policy and reference log-probs both stream (layers and head, forward; the reference has
    nothing trainable, so its forward runs a second graph, compiled once): two compiles over all
    steps, none from the toggles. Frozen weights are untouched and get no gradient; LoRA weights
    match the run without streambp."""
    build = dpo_builder(tmp_path, peft=True)
    ref_losses, ref_weights, rec, trainer, messages = train_pair(monkeypatch, build)
    assert_same_training(ref_losses, ref_weights, rec, trainer)
    assert_every_step_streamed(rec, steps=3)
    assert_no_whole_logits(rec, max_rows=4)
    st = state(trainer)
    assert st.compiles == 2 and st.frozen_calls == 3 and st.trl_kernel_calls == 0, st
    for step in rec.steps:  # policy forward + reference forward, one backward
        assert collections.Counter(step["forward"])["head"] == 2 and step["backward"].count("head") == 1, step
    base = tiny_model()
    frozen = {n.replace("base_model.model.", "").replace(".base_layer", ""): p
              for n, p in trainer.model.named_parameters() if "lora_" not in n}
    for n, p in base.named_parameters():
        assert torch.equal(frozen[n], p.detach()), f"frozen weight {n} changed"
        assert frozen[n].grad is None, f"frozen weight {n} got a gradient"


@pytest.mark.slow
@pytest.mark.extended
def test_dpo_full_finetune(monkeypatch, tmp_path):
    """DPO with a separate (frozen) reference model: the policy streams, one compile."""
    build = dpo_builder(tmp_path, peft=False)
    ref_losses, ref_weights, rec, trainer, messages = train_pair(monkeypatch, build)
    assert_same_training(ref_losses, ref_weights, rec, trainer)
    assert_every_step_streamed(rec, steps=3)
    assert state(trainer).compiles == 1


# ---- TRL GRPO --------------------------------------------------------------------------------------
def grpo_builder(tmp_path, peft=False, prompts=None, completion=6, fixed=True, **kw):
    from trl import GRPOConfig, GRPOTrainer

    tok = tokenizer()
    path = tmp_path / "tiny"
    if not path.exists():
        tiny_model().save_pretrained(path)
        tok.save_pretrained(path)
    prompts = prompts if prompts is not None else prompt_dataset()

    def build(callbacks):
        extra = {}
        if peft:
            from peft import LoraConfig

            extra["peft_config"] = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        gen = {"min_new_tokens": completion} if fixed else {}
        args = GRPOConfig(**common_args(
            output_dir=str(tmp_path / "out"), bf16=False, per_device_train_batch_size=4, num_generations=4,
            max_completion_length=completion, generation_kwargs=gen,
            model_init_kwargs={"dtype": torch.float32, "attn_implementation": "sdpa"}, **kw))
        return GRPOTrainer(model=str(path), reward_funcs=even_words, args=args, train_dataset=prompts,
                           processing_class=tok, callbacks=callbacks, **extra)

    return build


def test_grpo_peft_kl_two_iterations(monkeypatch, tmp_path):
    """GRPO with LoRA, a KL term (beta > 0: reference log-probs with the adapter off) and two
    iterations per generation (old-policy log-probs under no_grad): per-token log-probs, clipped
    objective and KL match the run without streambp; every training step streams layers and head;
    the old-policy forward runs the training graph (no extra compile), generation runs uncompiled
    (it never reaches the compiled graph or its recompile budget); the reference forward (adapter
    off, nothing trainable) streams through a second graph: two compiles in all."""
    build = grpo_builder(tmp_path, peft=True, beta=0.1, num_iterations=2)
    ref_losses, ref_weights, rec, trainer, messages = train_pair(monkeypatch, build)
    assert_same_training(ref_losses, ref_weights, rec, trainer)
    assert_every_step_streamed(rec, steps=3)
    assert_no_whole_logits(rec, max_rows=4)
    st = state(trainer)
    assert st.compiles == 2, st
    assert st.eager_calls > 0 and st.no_grad_calls > 0 and st.frozen_calls > 0 and st.trl_kernel_calls == 0, st


@pytest.mark.slow
@pytest.mark.extended
def test_grpo_full_finetune(monkeypatch, tmp_path):
    build = grpo_builder(tmp_path, peft=False)
    ref_losses, ref_weights, rec, trainer, messages = train_pair(monkeypatch, build)
    assert_same_training(ref_losses, ref_weights, rec, trainer)
    assert_every_step_streamed(rec, steps=3)
    assert state(trainer).compiles == 1


# ---- HF Trainer, accelerate --------------------------------------------------------------------------
def lm_dataset(n=16, lengths=(15,)):
    from datasets import Dataset

    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, V, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]
    return Dataset.from_dict({"input_ids": rows, "labels": rows, "note": ["unused column"] * n})


def test_hf_trainer(monkeypatch, tmp_path):
    """transformers.Trainer: the model keeps its forward signature (the unused dataset column is
    filtered out by reading it), gradient checkpointing is switched off with a note, gradient
    accumulation divides by num_items_in_batch inside the compiled loss; one compile."""
    from transformers import Trainer, TrainingArguments

    def build(callbacks):
        args = TrainingArguments(**common_args(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2,
                                               gradient_accumulation_steps=2, gradient_checkpointing=True))
        return Trainer(model=tiny_model(), args=args, train_dataset=lm_dataset(), callbacks=callbacks)

    ref_losses, ref_weights, rec, trainer, messages = train_pair(monkeypatch, build)
    assert_same_training(ref_losses, ref_weights, rec, trainer)
    assert_every_step_streamed(rec, steps=2)
    assert_no_whole_logits(rec, max_rows=2)
    assert state(trainer).compiles == 1
    assert inspect.signature(trainer.model.forward) == inspect.signature(tiny_model().forward)


def test_hf_trainer_evaluate_streams(monkeypatch, tmp_path):
    """Trainer.evaluate() between training steps (eval mode, no_grad, labels given): the same
    eval_loss as the plain Trainer's, before and after training; the evaluation forward streams
    its layers and head chunk by chunk with no backward, compiled once for all evaluations (two
    graphs in all: the training step's and the evaluation's)."""
    from transformers import Trainer, TrainingArguments

    eval_ds = lm_dataset(6)

    def build(callbacks):
        args = TrainingArguments(**common_args(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2,
                                               per_device_eval_batch_size=2, eval_strategy="steps", eval_steps=1))
        return Trainer(model=tiny_model(), args=args, train_dataset=lm_dataset(), eval_dataset=eval_ds,
                       callbacks=callbacks)

    torch._dynamo.reset()
    ref = build([])
    ref_losses = [ref.evaluate()["eval_loss"]]
    ref.train()
    ref_losses.append(ref.evaluate()["eval_loss"])
    trainer = build([streamfx.StreamBPCallback(**OPTIONS)])
    before = dict(COUNTERS)
    losses = [trainer.evaluate()["eval_loss"]]
    ran = {k: COUNTERS[k] - before[k] for k in ("region_forward", "chunks_forward", "region_backward")}
    trainer.train()
    losses.append(trainer.evaluate()["eval_loss"])
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    assert ran["region_forward"] >= 3 * (LAYERS + 1) and ran["chunks_forward"] > ran["region_forward"], ran
    assert ran["region_backward"] == 0, ran
    assert state(trainer).compiles == 2, state(trainer)


@pytest.mark.fast
def test_accelerate_loop(monkeypatch):
    """A loop of one's own under accelerate: ``model = streamfx.prepare(model)`` then
    ``accelerator.prepare``; losses and gradients equal eager's, layers and head stream. The
    model's config has use_cache=True (every HF config does): a training call runs without a KV
    cache, so nothing of the cache enters the compiled graph."""
    from accelerate import Accelerator

    torch._dynamo.reset()
    ids = torch.randint(3, V, (2, 16), generator=torch.Generator().manual_seed(0))
    ref = tiny_model()
    ref(input_ids=ids, labels=ids).loss.backward()
    with recording(monkeypatch) as rec:
        accelerator = Accelerator(cpu=True)
        model = streamfx.prepare(tiny_model(), **OPTIONS)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = accelerator.prepare(model, opt)
        rec.current = {"forward": [], "backward": []}
        out = model(input_ids=ids, labels=ids)
        accelerator.backward(out.loss)
        rec.steps.append(rec.current)
    assert out.logits is None  # the [B, T, V] logits were never kept
    assert_every_step_streamed(rec, steps=1)
    torch.testing.assert_close(out.loss, ref(input_ids=ids, labels=ids).loss, rtol=1e-5, atol=1e-6)
    for (n, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert ((p.grad - r.grad).abs().max() / r.grad.abs().max()).item() < 1e-5, n


# ---- the backend by name -----------------------------------------------------------------------------
@pytest.mark.fast
def test_torch_compile_backend_streambp_names_the_line(tmp_path):
    from accelerate import Accelerator
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), torch_compile_backend="streambp", use_cpu=True, report_to=[])
    with pytest.raises(ValueError, match=re.escape(sfx_trainers.CALLBACK_LINE)):
        Trainer(model=tiny_model(), args=args, train_dataset=lm_dataset())
    with pytest.raises(ValueError, match=re.escape(sfx_trainers.PREPARE_LINE)):
        Accelerator(cpu=True, dynamo_backend="streambp")
    with pytest.raises(ValueError, match="is not a valid DynamoBackend"):  # other names: accelerate's message
        Accelerator(cpu=True, dynamo_backend="no_such_backend")


@pytest.mark.fast
def test_torch_compile_wrapper_is_never_silently_bypassed(tmp_path):
    """A ``torch.compile`` wrapper handed to a trainer with the callback, or to ``prepare``, is
    refused with the line that works (TRL would replace its forward and nothing would stream)."""
    from trl import SFTConfig, SFTTrainer

    wrapped = torch.compile(tiny_model(), backend="streambp")
    with pytest.raises(streamfx.StreamBPError, match="OptimizedModule"):
        streamfx.prepare(wrapped)
    args = SFTConfig(**common_args(output_dir=str(tmp_path), bf16=False, per_device_train_batch_size=2))
    with pytest.raises(Exception, match=r"OptimizedModule|forward"):
        SFTTrainer(model=wrapped, args=args, train_dataset=text_dataset(), processing_class=tokenizer(),
                   callbacks=[streamfx.StreamBPCallback()])


@pytest.mark.fast
def test_callback_refuses_a_second_compile(tmp_path):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), torch_compile=True, use_cpu=True, report_to=[])
    with pytest.raises(streamfx.StreamBPError, match="torch_compile"):
        Trainer(model=tiny_model(), args=args, train_dataset=lm_dataset(), callbacks=[streamfx.StreamBPCallback()])


def test_an_evaluation_call_gets_no_kv_cache():
    """A prepared model's call with labels under no_grad (Trainer.evaluate's) gets use_cache=False
    where the config keeps use_cache=True: no [B, heads, T, head_dim] keys and values held per
    layer; its loss equals eager's. A no_grad call without labels keeps the config's cache."""
    torch._dynamo.reset()
    model, ref = tiny_model(), tiny_model()
    assert model.config.use_cache
    streamfx.prepare(model, **OPTIONS)
    ids = torch.randint(3, V, (2, 15), generator=torch.Generator().manual_seed(0))
    model.eval(), ref.eval()
    with torch.no_grad():
        out, want = model(input_ids=ids, labels=ids), ref(input_ids=ids, labels=ids)
        plain = model(input_ids=ids)
    assert out.past_key_values is None and want.past_key_values is not None
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-6, atol=1e-6)
    assert plain.past_key_values is not None


@pytest.mark.fast
def test_prepare_keeps_the_model_and_its_signature():
    model = tiny_model()
    signature = inspect.signature(model.forward)
    assert streamfx.prepare(model, **OPTIONS) is model
    assert inspect.signature(model.forward) == signature
    assert streamfx.prepare(model, **OPTIONS) is model  # again, same settings: nothing happens
    with pytest.raises(streamfx.StreamBPError, match="already prepared"):
        streamfx.prepare(model, chunk_size=4)
    with pytest.raises(streamfx.StreamBPError, match="unknown option"):
        streamfx.prepare(tiny_model(), chunk=4)


@pytest.mark.parametrize("isolation", ["torch's", "none"])
def test_every_model_prepared_in_a_process_streams_or_says_why_not(isolation, monkeypatch):
    """Dynamo keeps one list of compiled entries per function for every torch.compile call and runs
    the function eagerly, calling no backend, at ``recompile_limit`` entries; ``nn.Module._call_impl``
    is one function for every model. Under a limit of 1, two models prepared one after the other
    (a hyperparameter search, a policy beside its reference) both stream where torch keeps each
    compile's entries apart (``isolate_recompiles``, torch >= 2.13); without it (as before 2.13),
    the model that reaches no backend says so, once, naming the limit."""
    from torch._dynamo import config

    from streamfx import frames

    if isolation == "none":
        monkeypatch.setattr(frames, "isolated", lambda: {})
    elif not frames.isolated():
        pytest.skip("this torch has no isolate_recompiles")
    torch._dynamo.reset()
    ids = torch.randint(3, V, (1, 15), generator=torch.Generator().manual_seed(0))
    streamed = []
    with config.patch(recompile_limit=1), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            model = streamfx.prepare(tiny_model(), **OPTIONS)
            before = COUNTERS["region_forward"]
            model(input_ids=ids, labels=ids).loss.backward()
            streamed.append(COUNTERS["region_forward"] - before)
    said = [str(w.message) for w in caught if "without handing its graph" in str(w.message)]
    if isolation == "none":
        assert streamed == [len(STREAMED), 0] and len(said) == 1, (streamed, said)
        assert "recompile_limit (1)" in said[0], said
    else:
        assert streamed == [len(STREAMED)] * 2 and not said, (streamed, said)


@pytest.mark.fast
def test_a_prepared_model_run_eagerly_by_torch_says_so():
    """Compiling switched off (``torch.compiler.set_stance("force_eager")``): the training call runs
    eagerly and exactly, and says once that nothing streams; with ``strict`` it raises."""
    torch._dynamo.reset()
    ids = torch.randint(3, V, (1, 15), generator=torch.Generator().manual_seed(0))
    model, ref = streamfx.prepare(tiny_model(), **OPTIONS), tiny_model()
    with torch.compiler.set_stance("force_eager"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            loss = model(input_ids=ids, labels=ids).loss
        torch.testing.assert_close(loss, ref(input_ids=ids, labels=ids).loss)
        strict = streamfx.prepare(tiny_model(), strict=True, **OPTIONS)
        with pytest.raises(streamfx.StreamBPError, match="without handing its graph"):
            strict(input_ids=ids, labels=ids)
    said = [str(w.message) for w in caught if "without handing its graph" in str(w.message)]
    assert len(said) == 1 and "force_eager" in said[0], said


def test_generation_runs_uncompiled():
    """``generate`` on a prepared model compiles nothing, whatever its lengths; a training step
    afterwards compiles once and streams."""
    torch._dynamo.reset()
    model = streamfx.prepare(tiny_model(), **OPTIONS)
    prompt = torch.randint(3, V, (2, 5))
    for new in (3, 6, 9):
        model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    st = streamfx.state_of(model)
    assert st.compiles == 0 and st.eager_calls >= 3 + 6 + 9, st
    before = COUNTERS["region_backward"]
    ids = torch.randint(3, V, (2, 16))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    assert st.compiles == 1 and COUNTERS["region_backward"] - before == len(STREAMED)


# ---- explain ---------------------------------------------------------------------------------------
def test_explain_reports_the_prepared_settings():
    model = streamfx.prepare(tiny_model(), dynamic=False, **OPTIONS)
    ids = torch.randint(3, V, (2, 16))
    report = streamfx.explain(model, input_ids=ids, labels=ids, use_cache=False)
    assert report.settings == {"dynamic": False, "options": OPTIONS}
    assert {p.name for p in report.plan} == STREAMED
    assert all(p.chunk_size == HEAD_CHUNK for p in report.plan if p.name == "head")
    assert report.later_lengths is None and "dynamic=False compiles every new" in str(report)
    assert streamfx.state_of(model).compiles == 0  # explain left the prepared model's own compile alone


def test_explain_later_lengths_stream():
    """dynamic=None (torch.compile's default, and prepare's): explain also reports the symbolic
    compile a second length gets, and that compile must stream."""
    model = tiny_model()
    ids = torch.randint(3, V, (2, 16))
    report = streamfx.explain(model, input_ids=ids, labels=ids, use_cache=False, options=OPTIONS)
    assert report.settings["dynamic"] is None
    assert {p.name for p in report.plan} == STREAMED
    later = report.later_lengths
    assert later is not None and "later lengths" in str(report)
    # explaining changed nothing of the run itself: the same tensors compile with static sizes and stream
    streamfx.prepare(model, **OPTIONS)
    before = COUNTERS["region_backward"]
    model(input_ids=ids, labels=ids).loss.backward()
    assert streamfx.state_of(model).compiles == 1 and COUNTERS["region_backward"] - before == len(STREAMED)
    assert {p.name for p in later.plan} == STREAMED, later.not_streamed


# ---- mixed lengths ---------------------------------------------------------------------------------------
def test_sft_mixed_lengths_compile_twice_and_stream(monkeypatch, tmp_path):
    """Batches of 4 different lengths, dynamic=None: one static compile for the first shape and one
    symbolic compile serving every later shape (2 backend compiles over the whole dataset, not
    one per length: a size comparison that guarded on a symbolic length would specialise the
    symbolic compile to it), and every step streams."""
    build = sft_builder(tmp_path, text_dataset(8, (9, 9, 15, 15, 12, 12, 20, 20)), max_steps=4, max_length=64,
                        train_sampling_strategy="sequential")  # batches of 10, 16, 13, 21 tokens
    ref_losses, ref_weights, rec, trainer, messages = train_pair(monkeypatch, build)
    assert_same_training(ref_losses, ref_weights, rec, trainer)
    assert state(trainer).compiles == 2, (state(trainer).compiles, [repr(g[0]) for g in state(trainer).graphs])
    assert_every_step_streamed(rec, steps=4)


@pytest.mark.slow
@pytest.mark.extended   # (GRPO at every prompt and completion length: test_dynamic's TRL GRPO loss)
def test_grpo_mixed_lengths_compile_twice_and_stream(monkeypatch, tmp_path):
    """GRPO with prompts of two lengths and completions ending at EOS: every training step streams
    with at most two compiles (static first shape, then symbolic); generation never compiles."""
    build = grpo_builder(tmp_path, prompts=prompt_dataset(16, (4, 7)), fixed=False, max_steps=3)
    ref_losses, ref_weights, rec, trainer, messages = train_pair(monkeypatch, build)
    assert_same_training(ref_losses, ref_weights, rec, trainer)
    assert state(trainer).compiles <= 2, state(trainer)
    assert_every_step_streamed(rec, steps=3)


# ---- PEFT edge, bf16 ---------------------------------------------------------------------------------
@pytest.mark.fast
def test_peft_lora_on_q_and_v_only():
    """LoRA on q_proj and v_proj only (PEFT's default targets for Llama/Qwen): layer 0's keys need
    no gradient (the K/V producers' backward differentiates only what needs it), and the gradient
    reaches the residual stream only through the fused attention's outputs (a multi-output op:
    its tuple value counts as differentiable, else every LoRA gradient would be zero)."""
    import copy

    from peft import LoraConfig, get_peft_model

    torch._dynamo.reset()
    peft_model = get_peft_model(tiny_model(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"],
                                                         init_lora_weights=False))
    ref = copy.deepcopy(peft_model)
    streamfx.prepare(peft_model, **OPTIONS)
    ids = torch.randint(3, V, (2, 16))
    peft_model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    ref(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    for (n, p), (_, r) in zip(peft_model.named_parameters(), ref.named_parameters()):
        assert (p.grad is None) == (r.grad is None), n
        if r.grad is not None:
            assert ((p.grad - r.grad).abs().max() / r.grad.abs().max()).item() < 1e-5, n


def test_sft_trl_default_mixed_precision(monkeypatch, tmp_path):
    """TRL's default bf16=True: Accelerate wraps the model's forward (TRL's fused head) in a bf16
    autocast decorator and an fp32 conversion of the outputs. The head is found inside those
    wrappers and replaced inside them: layers and head stream under autocast, within bf16
    rounding of the run without streambp, with no warning."""
    build = sft_builder(tmp_path, text_dataset(), max_steps=2, max_length=64, bf16=True)
    ref_losses, ref_weights, rec, trainer, messages = train_pair(monkeypatch, build)
    assert not [m for m in messages if "not streamed" in m], messages
    torch.testing.assert_close(torch.tensor(rec.losses), torch.tensor(ref_losses), rtol=2e-2, atol=2e-2)
    assert_every_step_streamed(rec, steps=2)


@pytest.mark.slow
@pytest.mark.extended
def test_sft_bf16_model(monkeypatch, tmp_path):
    """A bf16 model under SFT: streambp's losses are no further from an fp32 run than the bf16
    run without streambp is (three times its error, at least 1e-3 absolute)."""
    from trl import SFTConfig, SFTTrainer

    tok, ds = tokenizer(), text_dataset()

    def run(dtype, callbacks):
        losses = Losses()
        args = SFTConfig(**common_args(output_dir=str(tmp_path), bf16=False, per_device_train_batch_size=2,
                                       max_length=64))
        trainer = SFTTrainer(model=tiny_model(dtype), args=args, train_dataset=ds, processing_class=tok,
                             callbacks=[losses.callback, *callbacks])
        trainer.train()
        return torch.tensor(losses.values)

    torch._dynamo.reset()
    fp32 = run(torch.float32, [])
    bf16 = run(torch.bfloat16, [])
    streamed = run(torch.bfloat16, [streamfx.StreamBPCallback(**OPTIONS)])
    eager_err = (bf16 - fp32).abs().max().item()
    assert (streamed - fp32).abs().max().item() <= max(3 * eager_err, 1e-3), (fp32, bf16, streamed)


# ---- the examples --------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("script", ["sft_trl.py", pytest.param("dpo_trl.py", marks=pytest.mark.extended),
                                    pytest.param("grpo_trl.py", marks=pytest.mark.extended)])
def test_example_runs(script):
    """Each example trains a few steps on CPU and reports that layers and head streamed."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    small = ["--words", "24"] + (["--completion", "8"] if script.startswith("grpo") else [])
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "examples", script), "--steps", "2",
                           "--codegen", "eager", *small], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "streamed every step: yes" in proc.stdout, proc.stdout[-3000:]
