"""What a SentencePiece training is given, each setting declared once (`TokenizerTrainSettings`):
`bert-jax tokenizer train`'s flags, their help and checks derive from these declarations, and
`train_tokenizer` / `train_sentencepiece` read their values and defaults here. No NumPy here:
`--help` reads it."""

from __future__ import annotations

import dataclasses

from bert_jax.runtime import declarations
from bert_jax.runtime.declarations import setting
from bert_jax.runtime.errors import UserError

# [PAD] [UNK] [CLS] [SEP] [MASK] (interface.SPECIAL_TOKENS) and at least one piece of text.
_SMALLEST_VOCAB = 5 + 1


@dataclasses.dataclass(frozen=True)
class TokenizerTrainSettings:
    """One SentencePiece model's training settings. `vocab_size` has no default: the command
    requires `--vocab-size`, a pretraining run gives `config.data.tokenizer_vocab_size`."""

    vocab_size: int | None = setting(
        None, "pieces, the five special tokens included", low=_SMALLEST_VOCAB
    )
    lowercase: bool = setting(False, "fold case (uncased model)")
    model_type: str = setting("unigram", "SentencePiece's algorithm", choices=("unigram", "bpe"))
    # SentencePiece itself refuses a coverage below 0.98 and a sample of 1 to 100 sentences, but
    # only after reading the corpus.
    character_coverage: float = setting(
        0.9995,
        "share of the corpus's characters the vocabulary covers (rarer ones become [UNK])",
        low=0.98,
        high=1.0,
    )
    input_sentence_size: int = setting(
        2_000_000,
        "sample at most this many sentences, which bounds memory on large corpora",
        low=101,  # SentencePiece's own floor for a sample
        also=(0,),
        zero="0: all of them",
    )

    def check(self, size_setting: str = "--vocab-size") -> None:
        """A UserError naming the first setting out of its range, before any input is read;
        `vocab_size` is named by `size_setting` (what set it: the flag, or the config key of a
        pretraining run that trains its own)."""
        if self.vocab_size is None:
            raise UserError(f"{size_setting} is required")

        def name_of(name: str) -> str:
            if name == "vocab_size":
                return size_setting
            return declarations.flag_name(name)

        for problem in declarations.problems(self, name_of=name_of):
            raise UserError(problem)
