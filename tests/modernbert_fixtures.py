"""A random transformers ModernBERT directory with its BPE tokenizer.json, built here (nothing from
a hub), and the same model converted into a bert-jax model directory: what the tests of the
commands that read a ModernBERT model (encode, fill-mask, eval, fine-tuning, bench) share."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import tokenizers
import torch
import transformers

from bert_jax.convert import hf_modernbert, modernbert_names
from bert_jax.convert.between_formats import convert
from bert_jax.core.modernbert_config import ModernBertConfig

SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Encoders read the whole sentence at once; decoders read it left to right.",
    "Rotary positions turn queries and keys by their position.",
    "A sliding window keeps attention near, and every third layer looks at everything.",
    "The lazy dog sleeps while the fox reads the news of the day.",
]
# The smallest ModernBERT shape the tests build models of: 32 wide, 2 heads, BERT's special ids
# of the test tokenizer (SPECIALS).
TINY = dict(
    vocab_size=300,
    hidden_size=32,
    intermediate_size=40,
    num_hidden_layers=2,
    num_attention_heads=2,
    max_position_embeddings=64,
    pad_token_id=3,
    bos_token_id=1,
    eos_token_id=2,
    cls_token_id=1,
    sep_token_id=2,
)
# Two global layers around a sliding-window one (a 6-token window), every bias on but the
# decoder's: the pieces ModernBERT-base has, at a size that compiles in a second.
CONFIG = ModernBertConfig(
    **{**TINY, "vocab_size": 320, "num_hidden_layers": 3},
    global_attn_every_n_layers=2,
    local_attention=6,
    global_rope_theta=1000.0,
    local_rope_theta=100.0,
    norm_bias=True,
    attention_bias=True,
    mlp_bias=True,
    classifier_bias=True,
)


def bpe_tokenizer_json(vocab_size: int, text: Sequence[str] = TEXT) -> str:
    """A byte-level BPE tokenizer.json as ModernBERT's is, trained on `text`: its five special
    tokens (ids 0-4, in SPECIALS' order), [MASK] stripping the space before it, a [CLS] $A [SEP]
    template."""
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    train = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(list(text) * 20, train)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)],
    )
    spec = json.loads(tokenizer.to_str())
    for added in spec["added_tokens"]:  # ModernBERT's [MASK] takes the space before it
        added["lstrip"] = added["content"] == "[MASK]"
    return json.dumps(spec)


def hf_masked_lm(
    config: ModernBertConfig = CONFIG, seed: int = 0
) -> transformers.ModernBertForMaskedLM:
    """A random transformers ModernBertForMaskedLM of `config`'s shape, every weight moved off
    its initial value (norms off 1, biases off 0)."""
    values = hf_modernbert.hf_config_from(config)
    hf_config = transformers.ModernBertConfig(**values, attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.ModernBertForMaskedLM(hf_config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    return model


def params_from_hf(model: torch.nn.Module, config: ModernBertConfig) -> dict:
    """A transformers ModernBertForMaskedLM's weights as our parameter tree (the decoder's tied
    copy of the embeddings left out), through the converter's name map."""
    state = {name: value.detach().numpy() for name, value in model.state_dict().items()}
    return modernbert_names.import_params(
        {name: value.shape for name, value in state.items()},
        state.__getitem__,
        config,
        with_heads=True,
        ignore=lambda name: "tied" if name in modernbert_names.TIED else None,
    )


def fast_tokenizer(path: str | os.PathLike) -> transformers.PreTrainedTokenizerFast:
    """transformers' fast tokenizer of the tokenizer.json in `path` with BERT's special names."""
    return transformers.PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(path, "tokenizer.json"),
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
    )


def modernbert_dirs(root, config: ModernBertConfig = CONFIG, seed: int = 0):
    """(transformers directory, bert-jax model directory, the transformers model): the random
    model saved with its tokenizer, then converted with `convert --from hf`."""
    hf_dir, ours = root / "hf", root / "model"
    model = hf_masked_lm(config, seed)
    model.save_pretrained(hf_dir)
    (hf_dir / "tokenizer.json").write_text(bpe_tokenizer_json(config.vocab_size))
    fast_tokenizer(hf_dir).save_pretrained(hf_dir)
    convert("hf", hf_dir, "bert-jax", ours)
    return hf_dir, ours, model
