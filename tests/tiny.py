"""Tiny random models built from configs in the test process (no network), and a tokenizer.

Every architecture the tests cover: Llama (GQA), Qwen3 (q/k norm), Mistral (sliding window),
Gemma 2 (soft-capping + alternating sliding layers), GPT-2, BERT, BART and T5 (cross-attention).
"""

from __future__ import annotations

import functools

import torch
import transformers as tf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS = [
    "the financial bank is located on river bank",
    "a quick brown fox jumps over the lazy dog",
    "attention is all you need; heads look at tokens",
    "Hello world! <b>bold</b> $x$ ** emoji 🙂 שלום e\u0301",
] * 4
VOCAB = 384
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.cache
def tokenizer(kind: str = "decoder") -> tf.PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (any text round-trips). Decoders prepend <s> like Llama;
    encoders wrap in [CLS] ... [SEP] like BERT."""
    specials = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    if kind == "encoder":
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
        )
        fast = tf.PreTrainedTokenizerFast(
            tokenizer_object=tok,
            pad_token="<pad>",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
        )
    else:
        bos = tok.token_to_id("<s>")
        if kind == "decoder":
            tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
        else:  # seq2seq: end with </s> like BART/T5
            eos = tok.token_to_id("</s>")
            tok.post_processor = processors.TemplateProcessing(
                single="$A </s>", special_tokens=[("</s>", eos)]
            )
        fast = tf.PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token="<s>",
            eos_token="</s>",
            pad_token="<pad>",
            additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        )
        fast.chat_template = CHAT_TEMPLATE
    return fast


SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    max_position_embeddings=512,
)


def configs() -> dict[str, tf.PretrainedConfig]:
    """One small config per architecture; names are the test ids."""
    return {
        "llama-gqa": tf.LlamaConfig(**SMALL, num_key_value_heads=2),
        "qwen3": tf.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=16),
        "mistral-sliding": tf.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=4),
        "gemma2": tf.Gemma2Config(
            **{**SMALL, "num_hidden_layers": 4},
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=4,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=30.0,
            query_pre_attn_scalar=16,
        ),
        "gpt2": tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=512),
        "bert": tf.BertConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            intermediate_size=96,
            max_position_embeddings=512,
        ),
        "bart": tf.BartConfig(
            vocab_size=VOCAB,
            d_model=64,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=96,
            decoder_ffn_dim=96,
            max_position_embeddings=512,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=2,
            forced_eos_token_id=None,
        ),
        "t5": tf.T5Config(
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=96,
            num_layers=2,
            num_decoder_layers=2,
            num_heads=4,
            pad_token_id=0,
            eos_token_id=2,
            decoder_start_token_id=0,
        ),
    }


ARCHS = tuple(configs())


def tokenizer_kind(arch: str) -> str:
    return {"bert": "encoder", "bart": "seq2seq", "t5": "seq2seq"}.get(arch, "decoder")


@functools.cache
def model(arch: str, seed: int = 0) -> tf.PreTrainedModel:
    """A tiny random model with float32 weights, eval mode (cached per arch)."""
    cfg = configs()[arch]
    torch.manual_seed(seed)
    if arch == "bert":
        m = tf.BertModel(cfg)
    elif arch in ("bart", "t5"):
        m = tf.AutoModelForSeq2SeqLM.from_config(cfg)
    else:
        m = tf.AutoModelForCausalLM.from_config(cfg)
    # Random init makes near-uniform attention; larger q/k weights make sharp, testable patterns.
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.dim() == 2 and any(
                k in name for k in ("q_proj", "k_proj", "query", "key", ".q.", ".k.", "c_attn")
            ):
                p.mul_(4.0)
    return m.eval()


def loaded(arch: str):
    """The tiny model wrapped as an attnviz LoadedModel (a fresh wrapper each call)."""
    import attnviz

    return attnviz.wrap_model(model(arch), tokenizer(tokenizer_kind(arch)), spec=f"tiny-{arch}")


def register() -> None:
    """Serve ``tiny:<arch>`` through `attnviz.server.specs` (the app tests pick them like any model)."""
    from attnviz.server import specs

    specs.register("tiny", loaded, "tiny test model")
