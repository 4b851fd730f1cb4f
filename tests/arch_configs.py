"""The tiny configs of tests/archs.py: sizes every config takes, per-architecture overrides, and
what the architectures table says about models that are not text models."""

# Sizes every config takes where it has the field (only fields the class already has are set).
SMALL: dict = {
    "hidden_size": 32,
    "d_model": 32,
    "n_embd": 32,
    "dim": 32,
    "embed_dim": 32,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "n_layers": 2,
    "num_layers": 2,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "num_decoder_layers": 2,
    "num_attention_heads": 4,
    "n_head": 4,
    "n_heads": 4,
    "num_heads": 4,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "num_key_value_heads": 2,
    "n_kv_heads": 2,
    "head_dim": 8,
    "d_kv": 8,
    "d_head": 8,
    "kv_channels": 8,
    "intermediate_size": 64,
    "ffn_dim": 64,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "d_ff": 64,
    "d_inner": 64,
    "n_inner": 64,
    "ffn_hidden_size": 64,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "expert_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_topk": 2,
    "top_k": 2,
    "n_group": 1,
    "topk_group": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "qk_head_dim": 16,
    "v_head_dim": 8,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "n_positions": 256,
    "n_ctx": 256,
    "embedding_size": 32,
    "projection_dim": 32,
    "rotary_dim": 4,
    "first_k_dense_replace": 1,
    "sliding_window": 4,
    "attention_window": 4,
    "num_buckets": 8,
    "max_relative_positions": 16,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 2,
    "vocab_size_per_layer_input": 512,  # Gemma 3n / 4 per-layer embeddings
    "hidden_size_per_layer_input": 8,
    "laurel_rank": 8,
}
# Per architecture: what SMALL cannot guess (hybrid layer patterns, odd head layouts).
_HYBRID4 = {"num_hidden_layers": 4}
_QWEN_NEXT = {"num_hidden_layers": 4, "full_attention_interval": 2}
EXTRA: dict[str, dict] = {
    "jamba": {**_HYBRID4, "attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2},
    "zamba": {"num_hidden_layers": 6, "attn_layer_period": 3, "attn_layer_offset": 1},
    "zamba2": {**_HYBRID4, "layers_block_type": ["linear_attention", "hybrid"] * 2},
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "mamba2": {"head_dim": 16, "n_groups": 1},  # groups must divide the 4 heads
    "bamba": {**_HYBRID4, "mamba_n_heads": 4, "attn_layer_indices": [1, 3]},
    "falcon_h1": {"mamba_n_heads": 4, "mamba_d_ssm": 64},
    "granitemoehybrid": {
        **_HYBRID4,
        "mamba_n_heads": 4,
        "layer_types": ["linear_attention", "full_attention"] * 2,
    },
    "qwen3_next": _QWEN_NEXT,
    "qwen3_5_text": _QWEN_NEXT,
    "qwen3_5_moe_text": _QWEN_NEXT,
    "qwen4_exp_text": _QWEN_NEXT,
    "qwen3_5": {"text_config": _QWEN_NEXT},
    "qwen3_5_moe": {"text_config": _QWEN_NEXT},
    "qwen4_exp": {"text_config": _QWEN_NEXT},
    "lfm3": _HYBRID4,
    "recurrent_gemma": {"num_hidden_layers": 3},
    "big_bird": {"attention_type": "original_full"},
    "bigbird_pegasus": {"attention_type": "original_full"},
    "encoder-decoder": {"decoder": {"is_decoder": True, "add_cross_attention": True}},
    # T5's config class has no decoder_start_token_id field (checkpoints set 0, the pad): set one
    # that is neither pad nor BOS, so a decoder started from the wrong token cannot pass unseen
    "t5": {"decoder_start_token_id": 2},
}
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
_QSA = {  # Qwen4-Exp's query-sparse-attention indexer (no defaults in the config class)
    "indexer_n_heads": 2,
    "indexer_kv_heads": 1,
    "indexer_head_dim": 8,
    "indexer_budget": 8,
    "indexer_compress_ratio": 2,
}
_GEMMA_SHARED_KV = {
    "num_hidden_layers": 4,
    "layer_types": ["sliding_attention", "full_attention"] * 2,
    "num_kv_shared_layers": 2,
}
_GEMMA4 = {**_GEMMA_SHARED_KV, "global_head_dim": 16}
_GEMMA4_ASSISTANT = {
    "global_head_dim": 16,
    "hidden_size_per_layer_input": 0,
    "vocab_size_per_layer_input": 0,
}
EXTRA.update(
    {
        # rope parameters per layer type, with M-RoPE sections adding up to head_dim / 2
        "cohere_compass_text": {
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                t: {**_ROPE, "mrope_section": [2, 1, 1]} for t in ("sliding_attention", "full_attention")
            },
        },
        # real DBRX checkpoints keep rope_theta in attn_config; the class has no default for it
        "dbrx": {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}},
        "dots1": {"n_shared_experts": 1},
        "lfm2_moe": {"layer_types": ["conv", "full_attention", "conv", "full_attention"], **_HYBRID4},
        "qwen4_exp_text": {**_QWEN_NEXT, **_QSA},
        "qwen4_exp": {"text_config": {**_QWEN_NEXT, **_QSA}},
        "zaya": {"num_experts_per_tok": 1},
        "funnel": {"architectures": ["FunnelModel"], "block_sizes": [1, 1], "d_head": 8},
        "reformer": {
            "attn_layers": ["local", "lsh"],
            "axial_pos_shape": [16, 16],
            "axial_pos_embds_dim": [16, 16],
            "local_attn_chunk_length": 4,
            "lsh_attn_chunk_length": 4,
            "num_buckets": 2,
            "attention_head_size": 8,
            "feed_forward_size": 64,
        },
        "blt": {"encoder_hash_byte_group_vocab": 64},
        # X-MOD runs one language adapter per input: the config names the default one
        "xmod": {"default_language": "en_XX"},
        "kimi_linear": {
            **_HYBRID4,
            "layer_types": ["linear_attention", "full_attention"] * 2,
            "linear_head_dim": 8,
            "linear_num_heads": 4,
        },
        "bailing_hybrid": {**_HYBRID4, "layer_group_size": 2},
        # GLM-5-Next (a vision-language model): Kimi delta blocks beside sparse-indexed MLA
        # attention, which its config requires without RoPE (NoPE) and with as many KV heads as heads
        "glm5_next": {
            "text_config": {
                "num_attention_heads": 4,
                "num_key_value_heads": 4,
                "qk_rope_head_dim": 0,
                "q_lora_rank": 16,
                "index_topk": 8,
                "index_kpool": 1,
                "layer_types": ["linear_attention", "full_attention"],
            }
        },
        "perceiver": {"num_latents": 8, "d_latents": 32, "num_self_attends_per_block": 2},
        # Gemma 4: wider heads in the full-attention layers (a heterogeneous per-layer config)
        "gemma4_text": _GEMMA4,
        "gemma4_unified_text": _GEMMA4,
        "gemma4": {"text_config": _GEMMA4},
        "gemma4_unified": {"text_config": _GEMMA4},
        # an assistant reads its target model's key/value states in every layer
        "gemma4_assistant": {"backbone_hidden_size": 32, "text_config": _GEMMA4_ASSISTANT},
        "gemma4_unified_assistant": {"backbone_hidden_size": 32, "text_config": _GEMMA4_ASSISTANT},
        # Gemma 3n: the last two layers reuse the keys and values of the last ones of their type
        "gemma3n_text": {**_GEMMA_SHARED_KV, "intermediate_size": 64},
        # NeoMME: two window sizes among its sliding layers (per-layer config), both < 12 tokens
        "neomme": {
            "num_hidden_layers": 3,
            "head_dim": 16,  # its M-RoPE rotates a quarter of head_dim, in multiples of 4
            "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
            "per_layer_config": {1: {"sliding_window": 8}, 2: {"sliding_window": None}},
        },
    }
)
# Dots3: MLA with a sparse indexer in some layers, fewer and smaller heads in its sliding layers.
_DOTS3 = {
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "index_n_heads": 2,
    "index_head_dim": 16,
    "index_topk": 8,
    "layer_types": ["indexed_attention", "sliding_attention"],
    **{
        f"swa_{k}": v
        for k, v in {
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "q_lora_rank": 16,
            "kv_lora_rank": 16,
            "head_dim": 16,
            "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 8,
            "v_head_dim": 8,
        }.items()
    },
}
EXTRA.update(
    {
        "dots3_note_text": _DOTS3,
        "dots3_note": {
            "text_config": _DOTS3,
            # the towers' adapters map into the text model's width
            "vision_config": {"pyramid_num_routed": [-1, 4], "adapter_in_dim": 32, "adapter_out_dim": 32},
            "audio_config": {"adapter_input_size": 32, "adapter_out_dim": 32, "downsample_hidden_size": 32},
        },
    }
)
for _vl in ("qwen2_vl", "qwen2_5_vl"):  # M-RoPE sections must add up to head_dim / 2
    EXTRA[_vl] = {"text_config": {"rope_parameters": {"rope_type": "default", "mrope_section": [2, 1, 1]}}}
for _mla in ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa", "minicpm3"):
    EXTRA[_mla] = {"num_key_value_heads": 4}
for _mla in ("longcat_flash", "youtu", "axk1", "axk2", "kimi_linear", "bailing_hybrid"):
    EXTRA[_mla] = {**EXTRA.get(_mla, {}), "num_key_value_heads": 4}
# Sinks applied after the softmax (output scaled by sigmoid(lse - sink)): eager returns the
# probabilities before that scaling; attnviz shows them with the sink's share taken out (rows
# sum to < 1, as GPT-OSS). Compared here with eager's renormalised: the same up to that scale.
SINK_AFTER_SOFTMAX = {"granite_swa", "granitemoe_swa"}
# What the table should say about a tiny config that differs from a checkpoint's in a way users meet.
NOTES: dict[str, str] = {
    "xmod": "tiny model with default_language set; a checkpoint without one fails until "
    "XmodPreTrainedModel.set_default_language() is called",
}
# Architectures in transformers' text mappings that are not text models (with the reason).
NOT_TEXT: dict[str, str] = {
    "musicgen": "audio generation over codebooks, not a text model",
    "musicgen_melody": "audio generation over codebooks, not a text model",
    "esmc": "protein language model (amino-acid tokens), not a text model",
    "nemo_speechlm": "speech-to-text model (audio input), not a text model",
    "gemma3n": "needs the timm library for its vision tower (not installed here)",
}


# Vision-language models: loaded whole, their language model runs on text alone.
VISION_LANGUAGE = (
    "llava",
    "llava_next",
    "mistral3",
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "paligemma",
    "idefics3",
)

# The top of docs/architectures.md (archs.render adds the table).
HEADER = """# Architectures

Every text architecture in transformers {version}'s causal-LM, masked-LM and seq2seq mappings,
plus the vision-language models llava, llava_next, mistral3, qwen2_vl, qwen2_5_vl, qwen3_vl,
paligemma and idefics3 (loaded whole; their language model runs on text alone), as a tiny
random model (hidden 32, 2-4 layers, fp32, built from the architecture's own config
class), run through attnviz's default path and compared layer by layer with a SEPARATE eager load
of the same weights (`output_attentions=True`, the same ids and all-ones masks as `tokenizer(text)`
gives, teacher-forced without a cache): every attention layer of every stack agrees within 1e-4
(measured: 2.6e-6 or less, in Gemma 4's deeper layers, whose inputs come from an SDPA forward in
one model and an eager one in the other; 8e-7 or less in every other architecture); any rows
slice (the first row alone included) of any heads equals those rows of the full layer; the
self-check (`extract(..., verify=True)`) passes on one layer of every stack; and an
encoder-decoder (tiny configs with pad 0, BOS 1, decoder start 2 where the config has one) starts
its decoder from the token the model's own `generate` starts from.

- **fast exact**: captured queries and keys, probabilities computed on demand (long inputs work).
- **eager exact (one layer at a time)**: the model's own eager attention module is run again on
  one layer's recorded input when that layer is asked for; never all layers' (heads, N, N) at once.
- **mixers exact**: no softmax layer (Mamba, RWKV); the token mixers' captured kernel inputs,
  each mixer self-checked against its reference.
- **refused**: attnviz says why, in the sentence shown.
- **skipped**: not a text model (the reason).
- **not covered**: no tiny model could be built here from the config class with small sizes (the
  error); not a statement about the model.

Hybrids list the blocks that have softmax attention, then each non-softmax token mixer, where it
is and how attnviz shows it (next section). Regenerate with `python tests/archs.py --write`
(tests/engine/test_architectures.py fails when this table and the code disagree).

## Token mixers other than softmax (attnviz.mixers)

`res.layout.mixers[b]` lists block b's token mixers; `res.layer(b, mixer=kind)` returns that
mixer's exact matrix, float32, rows on demand. Every one of these mixers is linear in its values
once its gates are fixed, so y_t = sum over s of A[t,s] v_s (+ a skip term) with A built from what
the mixer's core function received (captured by wrapping that function's global name, whichever
kernel runs). The matrices are signed and not probabilities ("effective attention").

- **per head** (one signed matrix per head): mamba2 (SSD: A[t,s] = (C_t.B_s) exp(A_h sum Δ) Δ_s
  over the scan's x, D·x separate), gated_delta (Gated DeltaNet) and kimi_delta (KDA:
  A[t,s] = β_s k_s^T M_(s+1)...M_t q_t over v, by a backward scan or a chunked one), lightning
  (MiniMax: (q_t.k_s) exp(-λ_h (t-s))). `res.mixer_contributions(b, kind)` gives each head's
  token-contribution norms through the output projection as well (gates and norm scales frozen).
- **per channel** (mamba = Mamba-1, short_conv = LFM2's gated short conv, rwkv = RWKV-4 WKV,
  rglru = RG-LRU): exact only per channel; the per-block view is the norm of each source token's
  contribution to the mixer's output through its output projection, gates frozen at their forward
  values (one "head").
- **self-check at run time**: each block's matrix must reproduce the kernel's own output (and,
  per channel, the contributions must sum to the mixer's output) within 1e-4 of the output's
  scale in float32 (2e-2 in bf16/fp16) before anything is shown; `extract(verify=True)` puts one
  block per kind into `res.checks`; a mismatch raises `MixerCheckFailed` with the figures.
- **not shown** (refused with the reason): xLSTM's mLSTM (no capture yet). Zamba's Mamba-1 runs
  one scan per channel group in one block; the groups are read in order as one per-channel mixer.
- Falcon-H1 (every block) and Zamba2 (its hybrid blocks) run attention and a Mamba-2 branch in the
  same block: both are listed, and `res.layout.mixer_note(b)` says each map shows one branch.
  zaya and inkling attention also mixes tokens through a short conv on q/k/v, which the softmax
  map does not show (`mixer_note`).

### What each Explain view does on each mixer (attnviz.explain.stream)

Hybrids and recurrent models are explained at block boundaries: `read_stream` keeps what each
block reads and what each part adds, each branch of a parallel block on its own, a μP scalar per
part read from the tensors and checked on every row (tests/engine/test_hybrid_stream.py holds the
oracles: final norm + LM head at each boundary, hand-patched runs, Σ parts = the logit, a branch's
direct effect by hand through the frozen final norm).

| view | softmax attention block | per-head mixer (mamba2, gated_delta, kimi_delta, lightning) | per-channel mixer (mamba, rwkv, short_conv, rglru) |
|---|---|---|---|
| logit lens | block boundary | block boundary | block boundary |
| direct logit attribution | the attention as one part (`block_attribution`); per head on pure transformers (`logit_attribution`) | the mixer's part, and each head through out_proj (`.heads`; gates and output norm frozen; lightning's norm spans heads: its split rests on the frozen scale) | the mixer as one part (no heads) |
| patching `residual` / `blocks` | yes | yes, the mixer module's output | yes, the mixer module's output |
| attribution patching `residual` / `blocks` | yes | yes | yes |
| patching `heads` / `heads_by_position`, attribution patching over them | softmax heads | each head's output before out_proj (its slice of out_proj's input, gates and norm applied); a block running two head-bearing branches side by side (Falcon-H1, Zamba2) refuses: use `blocks` | refused: no heads |
| head ablation (zero, mean) | `ablate_heads` (pure transformers) | `ablate_mixer_heads`: the head's output before out_proj set to 0 or its mean over the positions | refused: no heads |
| head search | `search_heads` (α) | `search_mixer_heads`: by signed A and by contribution size ‖c_{{t,s}}‖, labelled which | contribution size only (no signed A per head) |
| Compare, Generation | α head by head | distance back, self share, negative share per head (`attnviz.metrics.mixer_compare`); each new token's row | the same on ‖c‖, no negative share |
| routes, node inspection (`information_flow` on a `block_trace`) | α·W_O v per head (a gate before W_O frozen: Qwen3.5) | each head's c_{{t,s}} = A[t,s]·W_h(σ_t ⊙ v_s) through out_proj as an edge, gates and norms frozen, SSD's D·x_t on the self edge; node inspection of a head = its write through out_proj | the mixer as one component: block-level edges c_{{t,s}} = W(g_t ⊙ A[:, t, s] ⊙ v_s) (Mamba-1's D·x_t on the self edge; LFM2's conv bias from no token) |

Blocks that are not a sum of their parts keep their boundaries (lens, residual patching) and refuse
the attribution with the reason: RWKV's block 0 (its pre_ln normalises the embedding inside the
block), Zamba2's hybrid blocks (the shared attention reads the embeddings too). The routes start
RWKV's block 0 after its pre_ln (a sum from there) and refuse Zamba2 (its shared block passes the
attention's output through its own MLP before the stream). Routes' edges are checked per branch:
Σ_s c_{{t,s}} + rest (out_proj's bias) = what the branch adds (tests/engine/test_hybrid_routes.py:
plain torch hooks on transformers' modules, fp32, 1e-4 of the output's scale).

Exactness measured 2026-11-26 on tiny random models of each family (tests/engine/test_mixers.py
shapes, initializer_range 0.2, N = 150 tokens, past every kernel chunk; fp32 CPU). Each block's
check compares the rebuilt core output with the kernel's and the summed token contributions with
the mixer's output, each against its own scale; the worst comparison of the worst block:

| architecture | mixer | blocks | max abs Δ | scale | relative |
|---|---|---|---|---|---|
| bamba | mamba2 | 2 | 1.4e-06 | 3.7 | 4e-07 |
| mamba2 | mamba2 | 2 | 3.6e-07 | 2.3 | 2e-07 |
| falcon_h1 | mamba2 | 2 | 1.7e-07 | 0.85 | 2e-07 |
| nemotron_h | mamba2 | 1 | 1.4e-07 | 1.0 | 1e-07 |
| granitemoehybrid | mamba2 | 2 | 3.6e-06 | 5.1 | 7e-07 |
| zamba2 | mamba2 | 4 | 1.7e-06 | 5.1 | 3e-07 |
| qwen3_5_text | gated_delta | 2 | 1.5e-06 | 3.9 | 4e-07 |
| qwen3_next | gated_delta | 2 | 2.2e-06 | 3.3 | 7e-07 |
| olmo_hybrid | gated_delta | 1 | 1.4e-06 | 2.2 | 7e-07 |
| kimi_linear | kimi_delta | 2 | 8.3e-07 | 1.6 | 5e-07 |
| bailing_hybrid | kimi_delta | 2 | 7.0e-07 | 1.6 | 4e-07 |
| glm5_next (text model of the VLM) | kimi_delta | 1 | 1.0e-08 | 0.029 | 3e-07 |
| minimax | lightning | 1 | 3.7e-07 | 1.7 | 2e-07 |
| mamba | mamba (per channel) | 2 | 6.3e-08 | 0.29 | 2e-07 |
| falcon_mamba | mamba (per channel) | 2 | 6.6e-08 | 0.24 | 3e-07 |
| jamba | mamba (per channel) | 2 | 3.7e-07 | 1.3 | 3e-07 |
| zamba | mamba (per channel, 2 groups) | 6 | 1.7e-11 | 4.7e-05 | 4e-07 |
| lfm2_moe | short_conv (per channel) | 2 | 2.3e-07 | 0.96 | 2e-07 |
| rwkv | rwkv (per channel) | 2 | 3.2e-07 | 1.0 | 3e-07 |
| recurrent_gemma | rglru (per channel) | 2 | 8.6e-09 | 0.041 | 2e-07 |

The matrices themselves agree with the token-by-token textbook recurrences
(`attnviz.mixers.reference`) to 1e-12 in float64.

## All architectures

| architecture | attnviz | notes |
|---|---|---|
"""  # noqa: E501 - the Explain table's rows are one Markdown line each
