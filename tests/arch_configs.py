"""Tiny CPU configs for every causal-LM architecture of the installed transformers.

    for model_type, config_cls, model_cls in causal_lm_classes(): ...
    config = tiny_config("qwen3_moe")            # a shrunk config, not yet a model
    model = build("qwen3_moe", attn="sdpa")      # fp32, seed 0, train mode; raises Skip(reason)
    batch = inputs(model, B=2, T=24, seed=0, attention_mask=True, pad="left")

Shrinking is generic: it reads the default config's ``to_dict()`` and rewrites the entries whose
*names* it knows (hidden_size / n_embd / d_model, num_hidden_layers / n_layer, heads, experts,
MLA ranks, dropout, token ids, ...), compresses per-layer pattern lists (``layer_types``,
``mlp_layer_types``, ...) to one layer of each kind in their original order, recurses into
sub-configs (text / vision / audio configs of composite models) and rebuilds the config from
the result, so that what ``__init__`` derives from the sizes stays consistent.
``OVERRIDES`` holds the few per-model_type corrections that generic shrinking gets wrong; every
entry says why. ``SKIPS`` lists the families that cannot be built or run as a plain causal LM
on CPU, with the reason.
"""
from __future__ import annotations

import copy
import importlib
import warnings

import torch

HIDDEN = 64
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 16
INTER = 64
MOE_INTER = 32
VOCAB = 128
LAYERS = 2
MAX_POS = 256
EXPERTS = 4
TOP_K = 2
PAD, BOS, EOS = 0, 1, 2
# ids of multimodal special tokens (image, audio, boi, ...) live in [SPECIAL_LO, VOCAB); inputs()
# draws ordinary tokens from [3, SPECIAL_LO) so no text token is taken for an image placeholder
SPECIAL_LO = VOCAB - 16


class Skip(Exception):
    """The family cannot be built or run as a causal LM on CPU; ``str(e)`` says why."""


# ---- the generic rules: config key -> new value (only where the key exists and is not None) --
# the names configs give the number of experts each token is routed to
TOP_K_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k_experts")


def _c(v):
    return lambda old, d: v


SIZE_KEYS = {
    # widths
    "hidden_size": HIDDEN, "n_embd": HIDDEN, "d_model": HIDDEN, "n_embed": HIDDEN, "embed_dim": HIDDEN,
    "emb_dim": HIDDEN, "embedding_dim": HIDDEN, "dim_model": HIDDEN, "word_embed_proj_dim": HIDDEN,
    "embedding_size": HIDDEN, "input_embedding_size": HIDDEN, "output_embedding_size": HIDDEN,
    "adapter_in_dim": HIDDEN, "adapter_out_dim": HIDDEN, "adapter_input_size": HIDDEN,  # dots3 adapters:
    "adapter_output_size": HIDDEN,  # in = tower hidden, out = text hidden
    "attention_hidden_size": None,  # derived by some configs (rwkv: hidden size; zamba: 2 * hidden)
    # depth
    "num_hidden_layers": LAYERS, "n_layer": LAYERS, "n_layers": LAYERS, "num_layers": LAYERS,
    "decoder_layers": LAYERS, "encoder_layers": LAYERS, "num_decoder_layers": LAYERS,
    "num_encoder_layers": LAYERS, "num_blocks": LAYERS,
    # heads
    "num_attention_heads": HEADS, "n_head": HEADS, "n_heads": HEADS, "num_heads": HEADS,
    "decoder_attention_heads": HEADS, "encoder_attention_heads": HEADS, "attention_heads": HEADS,
    "num_decoder_attention_heads": HEADS, "num_encoder_attention_heads": HEADS,
    "swa_num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS, "n_kv_heads": KV_HEADS, "num_kv_heads": KV_HEADS,
    "swa_num_key_value_heads": KV_HEADS, "num_query_groups": KV_HEADS,
    "head_dim": HEAD_DIM, "kv_channels": HEAD_DIM, "attention_head_dim": HEAD_DIM, "d_head": HEAD_DIM,
    "dim_head": HEAD_DIM, "swa_head_dim": HEAD_DIM, "attention_head_size": HEAD_DIM,
    "rotary_dim": HEAD_DIM // 2,  # partial rotary (codegen, gptj): must not exceed head_dim
    # feed-forward
    "intermediate_size": INTER, "n_inner": INTER, "ffn_dim": INTER, "decoder_ffn_dim": INTER,
    "encoder_ffn_dim": INTER, "d_ff": INTER, "ffn_hidden_size": INTER, "dim_ff": INTER, "dff": INTER,
    "d_inner": INTER, "intermediate_size_mlp": INTER, "feed_forward_size": INTER,
    "dense_intermediate_size": INTER, "prefix_dense_intermediate_size": INTER,
    "moe_intermediate_size": MOE_INTER, "shared_expert_intermediate_size": MOE_INTER,
    "shared_intermediate_size": MOE_INTER, "expert_intermediate_size": MOE_INTER,
    "moe_shared_expert_intermediate_size": MOE_INTER, "shared_experts_intermediate_size": MOE_INTER,
    "expert_ffn_hidden_size": MOE_INTER,
    # vocabulary, positions
    "vocab_size": VOCAB, "max_position_embeddings": MAX_POS, "n_positions": MAX_POS, "n_ctx": MAX_POS,
    "max_seq_len": MAX_POS, "max_sequence_length": MAX_POS, "max_target_positions": MAX_POS,
    "max_source_positions": MAX_POS, "context_length": MAX_POS, "model_max_length": MAX_POS,
    "original_max_position_embeddings": MAX_POS,
    # mixture of experts
    "num_experts": EXPERTS, "num_local_experts": EXPERTS, "n_routed_experts": EXPERTS,
    "moe_num_experts": EXPERTS,
    **{k: TOP_K for k in TOP_K_KEYS},
    "n_shared_experts": 1, "num_shared_experts": 1, "moe_num_shared_experts": 1,
    "n_group": 1, "topk_group": 1, "num_expert_group": 1,
    "first_k_dense_replace": 1, "num_dense_layers": 1,
    # multi-head latent attention (MLA)
    "q_lora_rank": 32, "kv_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
    "v_head_dim": HEAD_DIM, "qk_head_dim": 16, "o_lora_rank": 16,
    # sparse-attention indexers (DeepSeek V3.2 style)
    "index_n_heads": 2, "index_head_dim": 16, "index_topk": 16, "indexer_n_heads": 2,
    "indexer_kv_heads": 1, "indexer_head_dim": 16,
    # linear attention / SSM
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_num_heads": HEADS, "linear_head_dim": HEAD_DIM,
    "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_num_heads": 8,
    "mamba_head_dim": 16, "ssm_state_size": 16, "state_size": 16, "mamba_dt_rank": 8,
    "time_step_rank": 8, "n_mamba_heads": 2, "mamba_headdim": 16, "mamba_chunk_size": 8,
    "chunk_size": 8, "lru_width": HIDDEN, "laurel_rank": 8, "hidden_size_per_layer_input": 8,
    "vocab_size_per_layer_input": VOCAB, "adapter_rank": 8, "altup_num_inputs": 2,
    "router_hidden_size": 32, "hc_lowrank": 8, "ple_embed_dim": 8,
    # windows: smaller than the test lengths (T=24) so sliding layers really slide
    "sliding_window": 16, "sliding_window_size": 16, "attention_window_size": 16, "window_size": 16,
    "attention_chunk_size": 16, "local_attention": 16, "local_attention_window_len": 16,
}
# set even where the default is None (several configs leave them None and their modeling code
# then fails on the default config too: hunyuan_v1_*, ministral, nemotron)
ALWAYS = ("head_dim", "num_key_value_heads")
DROPOUT_WORDS = ("dropout", "pdrop", "drop_path", "layerdrop", "jitter")
# keys naming token ids that index the vocabulary
TEXT_TOKEN_KEYS = {"pad_token_id": PAD, "bos_token_id": BOS, "eos_token_id": EOS, "decoder_start_token_id": EOS,
                   "forced_eos_token_id": EOS, "sep_token_id": EOS, "cls_token_id": BOS, "eod_token_id": EOS,
                   "mask_token_id": 3, "unk_index": 3, "mask_index": 3}
FORCE = {"use_cache": False, "tie_word_embeddings": None, "output_router_logits": False,
         "quantization_config": "__drop__", "is_decoder": True, "add_cross_attention": False,
         "use_mamba_kernels": False, "use_mem_eff_path": False, "pretraining_tp": 1,
         "dtype": None, "torch_dtype": None}


# ---- per-model_type corrections, each with its reason ----------------------------------------
OVERRIDES: dict[str, dict] = {
    # Falcon: the default is the 7B multi-query layout (new_decoder_architecture False, one
    # fused qkv with a single K/V head: the ``qkv[..., [-2], :]`` index path); num_kv_heads = 1.
    "falcon": {"num_kv_heads": 1},
    # MPT: the FFN width is expansion_ratio * d_model (no intermediate_size key).
    "mpt": {"expansion_ratio": 1},
    # Zamba: the shared attention block reads [hidden, embeddings] (2 * hidden) and is tied
    # across the hybrid layers; tying needs at least two hybrid layers (period 2, offset 1, 4 layers).
    "zamba": {"attention_hidden_size": 2 * HIDDEN, "attention_head_dim": 2 * HIDDEN // HEADS,
              "num_key_value_heads": HEADS, "num_hidden_layers": 4, "attn_layer_period": 2,
              "attn_layer_offset": 1, "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"]},
    # Zamba2: same shared block on 2 * hidden; its head counts are per query group.
    "zamba2": {"attention_hidden_size": 2 * HIDDEN, "attention_head_dim": 2 * HIDDEN // HEADS,
               "kv_channels": HIDDEN // HEADS, "num_key_value_heads": HEADS, "num_query_groups": HEADS,
               "mamba_headdim": 16, "n_mamba_heads": 8},
    # RWKV: attention_hidden_size / intermediate_size are not derived once given.
    "rwkv": {"attention_hidden_size": HIDDEN, "intermediate_size": 4 * HIDDEN},
    # Jamba: layer kinds come from periods/offsets, not lists: one attention and one MoE layer.
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    # Mamba2: hidden_size * expand must equal num_heads * head_dim (8 * 16 = 2 * 64).
    "mamba2": {"num_heads": 8, "head_dim": 16, "n_groups": 1},
    # Falcon-H1: the Mamba inner width mamba_d_ssm = mamba_n_heads * mamba_d_head.
    "falcon_h1": {"mamba_d_ssm": 8 * 16},
    # ZAYA supports top-1 routing only.
    "zaya": {"num_experts_per_tok": 1},
    # Gemma 4 assistant (drafter) models: per-layer inputs must be off.
    "gemma4_assistant": {"hidden_size_per_layer_input": 0},
    "gemma4_unified_assistant": {"hidden_size_per_layer_input": 0},
    # Gemma3n text: no KV sharing across the two kept layers.
    "gemma3n_text": {"num_kv_shared_layers": 0},
    # Reformer: in training the axial position shape must multiply to the sequence length (the
    # sweep's T=12) and the chunk lengths divide it; local attention only.
    "reformer": {"axial_pos_shape": [3, 4], "axial_pos_embds_dim": [32, 32], "attn_layers": ["local", "local"],
                 "local_attn_chunk_length": 4, "lsh_attn_chunk_length": 4, "num_buckets": 4},
    # LFM2: the FFN width is rounded up to block_multiple_of unless auto-adjust is off.
    "lfm2": {"block_multiple_of": 16, "block_auto_adjust_ff_dim": False},
    # Marian: the decoder has its own vocabulary size.
    "marian": {"decoder_vocab_size": VOCAB},
    # MoE sizes that default to None (the default config does not build a model either).
    "deepseek_v2": {"num_experts_per_tok": TOP_K},
    "dots1": {"n_routed_experts": EXPERTS, "num_experts_per_tok": TOP_K, "n_shared_experts": 1},
    # dots3: the sliding-window layers use plain heads of qk_nope + qk_rope dims.
    "dots3_note_text": {"head_dim": 16, "swa_head_dim": 16},
    # GPT-Neo: attention_types is [[pattern, repeats]]; attention_layers is derived from it and
    # num_layers must match it.
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "attention_layers": ["global", "local"], "num_layers": 2},
    # LFM2-MoE: layer_types defaults to None (the default config does not build a model).
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # Qwen4-exp text: the sparse-attention indexer has no default sizes or budget.
    "qwen4_exp_text": {"indexer_budget": 16, "indexer_compress_ratio": 4, "indexer_n_heads": 2,
                       "indexer_kv_heads": 1, "indexer_head_dim": 16},
    # Cohere Compass: rope_parameters defaults to {} but the model reads one entry per layer type.
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    # Dory: input, recurrent (run n_recurrent_loops times, one set of weights) and output layers
    # must add up to the layer count; the checkpoint's lists name 56 layers.
    "dory": {"num_hidden_layers": 4, "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                                                      "full_attention"],
             "n_input_layers": 1, "n_recurrent_layers": 2, "n_output_layers": 1},
    # Kolibri 1.1: the checkpoint's lists name 46 layers; here a sliding-window layer, an indexer
    # layer, a sliding-window layer and an indexed layer reading the indexer layer's K/V, the
    # indexer's sizes shrunk to the sweep's T=12 (index_num_heads at most the query heads per KV head).
    "kolibri1_1": {"num_hidden_layers": 4, "layer_types": ["sliding_attention", "indexed_attention",
                                                            "sliding_attention", "indexed_attention"],
                   "index_layers": [1], "kv_source_layers": [0, 1, 2, 1], "mlp_only_layers": [0],
                   "index_topk": 2, "index_pool_size": 16, "index_compression": 4, "index_num_heads": 2,
                   "index_num_local_tokens": 4, "index_num_sink_tokens": 1, "sliding_window": 4},
    # DBRX: the attention sub-config's to_dict() drops rope_theta, which the model reads.
    "dbrx": {"attn_config": {"kv_n_heads": KV_HEADS, "rope_theta": 10000.0, "clip_qkv": 8.0, "attn_pdrop": 0.0}},
}

# families that cannot be built / run as plain causal LMs on CPU, with the reason
SKIPS: dict[str, str] = {
    "gemma3n": "multimodal Gemma3n needs the timm package for its vision tower (not installed); "
               "its text model is covered by gemma3n_text",
    "gemma4_assistant": "a drafter (speculative-decoding assistant) model whose nested config keeps "
                        "per-layer inputs on; not a standalone causal LM",
    "gemma4_unified_assistant": "a drafter model that reads the target model's KV cache (its layers "
                                "produce no cache of their own); not a standalone causal LM",
    "musicgen": "audio-codebook decoder: input_ids are [batch * num_codebooks, T] and the config is "
                "a text-encoder + audio-encoder + decoder composite",
    "musicgen_melody": "audio-codebook decoder (as musicgen)",
    "blt": "Byte Latent Transformer: byte-level local encoder, patcher and global transformer with "
           "hash n-gram embeddings; generic shrinking of its five sub-configs gives inconsistent "
           "projection sizes (not investigated further)",
}


# ---- discovery --------------------------------------------------------------------------------
def causal_lm_classes():
    """[(model_type, config class, causal-LM model class)] for every entry of transformers'
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES whose classes import."""
    out = []
    for model_type in _names():
        try:
            out.append((model_type, _config_cls(model_type), _model_cls(model_type)))
        except Exception:
            continue
    return out


def _names():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _config_cls(model_type):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    return CONFIG_MAPPING[model_type]


def _model_cls(model_type):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    import transformers
    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    cls = getattr(transformers, name, None)
    if cls is None:
        mod = importlib.import_module(f"transformers.models.{model_type_to_module_name(model_type)}")
        cls = getattr(mod, name)
    return cls


# ---- shrinking ------------------------------------------------------------------------------
def _default_dict(config_cls) -> dict:
    try:
        return config_cls().to_dict()
    except Exception:
        # some configs validate their defaults against each other; fall back to the class attributes
        cfg = config_cls.__new__(config_cls)
        return {k: copy.deepcopy(v) for k, v in vars(cfg).items()}


def _layer_count(d: dict):
    for k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "decoder_layers", "num_decoder_layers"):
        if isinstance(d.get(k), int):
            return k, d[k]
    return None, None


def _is_index_list(v, n_layers) -> bool:
    """A list of layer indices (moe_layers, full_attn_idxs, hybrid_layer_ids, ...): ints, strictly
    increasing, all < n_layers, not a per-layer 0/1 flag list."""
    if not isinstance(v, (list, tuple)) or not v or not all(type(x) is int for x in v):
        return False
    if len(v) == n_layers and set(v) <= {0, 1}:
        return False
    return all(a < b for a, b in zip(v, v[1:])) and 0 <= v[0] and v[-1] < n_layers


def _compress_patterns(d: dict, n_layers: int | None) -> int | None:
    """Per-layer lists of length ``n_layers`` (layer_types, mlp_layer_types, no_rope_layers,
    per-layer sizes, ...), lists of layer indices (moe_layers, full_attn_idxs, ...) and dicts keyed
    by layer index (per_layer_config) are cut to the layers that cover each distinct combination
    of their entries, in order (at least LAYERS layers). Returns the new layer count, or None if
    the config has no such entries."""
    if not n_layers or n_layers < 2:
        return None
    skip = ("suppress_tokens", "begin_suppress_tokens", "time_step_limit")
    lists = {k: v for k, v in d.items() if isinstance(v, (list, tuple)) and len(v) == n_layers and k not in skip
             and not _is_index_list(v, n_layers)
             and all(isinstance(x, (str, int, float, bool)) or x is None for x in v)}
    index_lists = {k: v for k, v in d.items() if k not in skip and k not in lists and _is_index_list(v, n_layers)}
    keyed = {k: v for k, v in d.items() if isinstance(v, dict) and v
             and all(str(x).lstrip("-").isdigit() for x in v)}
    if not (lists or index_lists or keyed):
        return None
    columns = [list(v) for v in lists.values()]
    columns += [[i in set(v) for i in range(n_layers)] for v in index_lists.values()]
    columns += [[v.get(i, v.get(str(i))) is not None for i in range(n_layers)] for v in keyed.values()]
    keep, seen = set(), set()
    for i in range(n_layers):
        key = tuple(repr(c[i]) for c in columns)
        if key not in seen:
            seen.add(key)
            keep.add(i)
    i = 0
    while len(keep) < min(LAYERS, n_layers):
        keep.add(i)
        i += 1
    idx = sorted(keep)
    new_pos = {old: new for new, old in enumerate(idx)}
    for k, v in lists.items():
        d[k] = [v[i] for i in idx]
    for k, v in index_lists.items():
        d[k] = [new_pos[i] for i in v if i in new_pos]
    for k, v in keyed.items():
        d[k] = {type(x)(new_pos[int(x)]) if not isinstance(x, int) else new_pos[x]: y
                for x, y in v.items() if int(x) in new_pos}
    return len(idx)


def _shrink_sizes(d: dict) -> dict:
    """Only the size entries of a per-layer override dict."""
    d = {k: (SIZE_KEYS[k] if SIZE_KEYS.get(k) is not None and isinstance(v, int) and not isinstance(v, bool) else v)
         for k, v in d.items()}
    if d.get("kv_lora_rank") and "num_key_value_heads" in d:
        d["num_key_value_heads"] = d.get("num_attention_heads", HEADS)
    return d


def _shrink(d: dict, model_type: str, top: bool = True) -> dict:
    d = copy.deepcopy(d)
    lk, n_layers = _layer_count(d)
    new_layers = _compress_patterns(d, n_layers)
    for k, v in list(d.items()):
        if k in ALWAYS and SIZE_KEYS.get(k) is not None and v is None:
            d[k] = SIZE_KEYS[k]
        elif k in SIZE_KEYS and SIZE_KEYS[k] is not None and v is not None and not isinstance(v, (bool, dict, str)):
            d[k] = [SIZE_KEYS[k]] * len(v) if isinstance(v, (list, tuple)) else SIZE_KEYS[k]
        elif any(w in k for w in DROPOUT_WORDS) and isinstance(v, float):
            d[k] = 0.0
        elif k in TEXT_TOKEN_KEYS and v is not None:
            d[k] = TEXT_TOKEN_KEYS[k] if not isinstance(v, list) else [TEXT_TOKEN_KEYS[k]]
        elif (k.endswith("token_id") or k.endswith("token_index")) and isinstance(v, int) and k not in TEXT_TOKEN_KEYS:
            d[k] = None  # filled below with distinct ids >= SPECIAL_LO
        elif isinstance(v, dict) and v and all(str(x).lstrip("-").isdigit() for x in v):
            # per-layer overrides keyed by layer index (already cut by _compress_patterns)
            d[k] = {x: _shrink_sizes(y) if isinstance(y, dict) else y for x, y in v.items()}
        elif isinstance(v, dict) and ("model_type" in v or k.endswith("_config") or k in ("text_config", "decoder")):
            d[k] = _shrink(v, v.get("model_type", model_type), top=False)
    special = [k for k, v in d.items() if v is None and (k.endswith("token_id") or k.endswith("token_index"))
               and k not in TEXT_TOKEN_KEYS]
    for i, k in enumerate(sorted(special)):
        d[k] = SPECIAL_LO + i
    if "pad_token_id" in d or top:
        d["pad_token_id"] = PAD
    if lk and new_layers:
        d[lk] = max(new_layers, LAYERS)
    for k, v in FORCE.items():
        if k in d:
            if v == "__drop__":
                d.pop(k)
            elif v is not None:
                d[k] = v
    # MoE top-k never above the number of experts; rope dims consistent with the head dim
    if d.get("qk_nope_head_dim") and d.get("qk_rope_head_dim") and "qk_head_dim" in d:
        d["qk_head_dim"] = d["qk_nope_head_dim"] + d["qk_rope_head_dim"]
    if d.get("kv_lora_rank") and "num_attention_heads" in d:
        # MLA: keys and values are expanded per head from the latent; no grouped KV heads
        if "num_key_value_heads" in d:
            d["num_key_value_heads"] = d["num_attention_heads"]
        if "head_dim" in d and d.get("qk_rope_head_dim"):
            d["head_dim"] = d["qk_rope_head_dim"]  # DeepSeek MLA configs: head_dim is the rope part
    rope = d.get("rope_parameters") or d.get("rope_scaling")
    if isinstance(rope, dict):
        if "mrope_section" in rope:
            rot = int(d.get("head_dim", HEAD_DIM) * rope.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0)))
            half = rot // 2
            rope["mrope_section"] = [half - 2 * (half // 3), half // 3, half // 3]
        if rope.get("rope_type") not in (None, "default") and "original_max_position_embeddings" in rope:
            rope["original_max_position_embeddings"] = MAX_POS // 2
        for key in ("short_factor", "long_factor"):
            if isinstance(rope.get(key), list):
                rope[key] = [1.0] * (int(d.get("head_dim", HEAD_DIM) * d.get("partial_rotary_factor", 1.0)) // 2)
    d.update(copy.deepcopy(OVERRIDES.get(model_type, {})))
    return d


def tiny_config(model_type: str):
    """A tiny config of ``model_type``: see the module docstring."""
    config_cls = _config_cls(model_type)
    d = _shrink(_default_dict(config_cls), model_type)
    for k in ("transformers_version", "architectures", "_name_or_path", "model_type", "id2label", "label2id"):
        d.pop(k, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = config_cls(**d)
    cfg.use_cache = False
    for sub in _sub_configs(cfg):
        if hasattr(sub, "use_cache"):
            sub.use_cache = False
    return cfg


def _sub_configs(cfg):
    from transformers import PretrainedConfig
    out = []
    for k, v in vars(cfg).items():
        if isinstance(v, PretrainedConfig):
            out.append(v)
    return out


def _set_attn(cfg, attn):
    cfg._attn_implementation = attn
    for sub in _sub_configs(cfg):
        try:
            sub._attn_implementation = attn
        except Exception:
            pass


def _msg(e) -> str:
    """The first two non-empty lines of an exception (validation errors put the cause second)."""
    lines = [l.strip() for l in str(e).splitlines() if l.strip()]
    return " ".join(lines[:2])[:300]


def build(model_type: str, attn: str = "sdpa", **overrides):
    """The tiny model of ``model_type``: fp32, seeded with 0, in train mode. Raises Skip.
    ``overrides`` are set on the tiny config before the model is built (``alibi=True``,
    ``output_router_logits=True``, ...)."""
    if model_type in SKIPS:
        raise Skip(SKIPS[model_type])
    try:
        model_cls = _model_cls(model_type)
    except Exception as e:  # an import error: a missing optional package
        raise Skip(f"model class does not import: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    try:
        cfg = tiny_config(model_type)
    except Exception as e:
        raise Skip(f"tiny config does not build: {type(e).__name__}: {_msg(e)}")
    for k, v in overrides.items():
        setattr(cfg, k, v)
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        if text is not cfg and hasattr(text, k):
            setattr(text, k, v)
    _set_attn(cfg, attn)
    torch.manual_seed(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = _instantiate(model_cls, cfg)
    except Exception as e:
        raise Skip(f"model does not build from the tiny config: {type(e).__name__}: {_msg(e)}")
    model = model.float().train()
    got = getattr(model.config, "_attn_implementation", None)
    if got != attn:
        raise Skip(f"attn_implementation={attn!r} not supported (model uses {got!r})")
    return model


def _instantiate(model_cls, cfg):
    """``model_cls(cfg)``; where the class takes the text part of a composite config (Llama4,
    Qwen3.5, Emu3: MODEL_FOR_CAUSAL_LM maps the composite model_type to the text-only class),
    the text config, as AutoModelForCausalLM.from_config does."""
    want = getattr(model_cls, "config_class", None)
    if want is not None and not isinstance(cfg, want) and hasattr(cfg, "get_text_config"):
        text = cfg.get_text_config()
        if isinstance(text, want):
            cfg = text
    model = model_cls(cfg)
    if hasattr(model, "set_default_language"):  # X-MOD: adapters are per language
        langs = getattr(cfg, "languages", None) or []
        if langs:
            model.set_default_language(langs[0])
    return model


def vocab_of(model) -> int:
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    n = getattr(emb, "num_embeddings", None)
    if n is None:
        cfg = model.config
        cfg = getattr(cfg, "text_config", None) or cfg
        n = cfg.vocab_size
    return int(n)


def inputs(model, B: int, T: int, seed: int = 0, attention_mask: bool = False, pad: str | None = None,
           n_pad: int = 5) -> dict:
    """input_ids and labels (labels = input_ids, -100 on padding) for ``model``'s vocabulary; with
    ``attention_mask`` also the mask, with ``pad`` ("left" or "right") the last row padded by
    ``n_pad`` tokens."""
    V = vocab_of(model)
    hi = min(V, SPECIAL_LO)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, hi, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    if pad == "left":
        mask[-1, :n_pad] = 0
    elif pad == "right":
        mask[-1, T - n_pad:] = 0
    pad_id = getattr(model.config, "pad_token_id", None)
    pad_id = PAD if pad_id is None else (pad_id[0] if isinstance(pad_id, list) else pad_id)
    ids = ids.masked_fill(mask == 0, pad_id)
    labels = ids.masked_fill(mask == 0, -100)
    out = dict(input_ids=ids, labels=labels)
    if attention_mask or pad is not None:
        out["attention_mask"] = mask
    return out
