"""transformers' tokenizer files for a bert-jax tokenizer, in either family's export.

`write_hf_tokenizer` writes tokenizer.json (what transformers' tokenizers backend runs; the one
file transformers 5 reads for a ModernBERT directory), tokenizer_config.json and
special_tokens_map.json beside the tokenizer's own files. The tokenizer.json is written as JSON
(an export needs no `tokenizers` package), spelled as transformers' own conversions write it:
`wordpiece_tokenizer_json` as `BertConverter`, `sentencepiece_tokenizer_json` as
`SpmConverter.build_tokenizer_from_spm_proto`, so `AutoTokenizer.from_pretrained` gives
bert-jax's ids (tests/test_modernbert_export.py, tests/test_data_special_tokens.py).
"""

from __future__ import annotations

import base64
import json
import os
import re
from collections.abc import Mapping
from typing import Any

from bert_jax.convert.strict import ConversionError
from bert_jax.data.tokenizers.hf_bpe import TOKENIZER_JSON, HfBpeTokenizer
from bert_jax.runtime import fs


def write_hf_tokenizer(
    path: str,
    tokenizer: Any,
    max_length: int,
    model_input_names: tuple[str, ...] | None = None,
) -> list[str]:
    """Tokenizer files for transformers: `AutoTokenizer.from_pretrained` and the pipelines give
    bert-jax's ids, in either family (transformers 5 runs ModernBERT's tokenizer from
    tokenizer.json alone, whatever tokenizer_config.json names).

    Both kinds: tokenizer.json (`wordpiece_tokenizer_json` / `sentencepiece_tokenizer_json`),
    tokenizer_config.json, special_tokens_map.json, and the tokenizer's own files with
    bert_jax_tokenizer.json (what `load_tokenizer` reads). WordPiece's tokenizer_config.json names
    BertTokenizer (do_lower_case), which also reads vocab.txt; SentencePiece's names
    PreTrainedTokenizerFast, the tokenizer.json as written. Either reads the five special tokens
    written in text ("[MASK]", ...) as bert-jax's tokenizers do
    (tests/test_data_special_tokens.py). A BPE tokenizer (ModernBERT's) saves transformers'
    tokenizer.json itself, named PreTrainedTokenizerFast alike. `model_input_names`: the inputs
    the model's forward takes, where they are not BERT's three (ModernBERT has no token types).
    """
    from bert_jax.data.tokenizers import interface as tokenizer_lib

    special = dict(
        zip(
            ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"),
            tokenizer.convert_ids_to_tokens(
                [tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id]
                + [tokenizer.mask_id]
            ),
        )
    )
    tokenizer.save(path)
    files = sorted(
        name
        for name in fs.listdir(path)
        if name in (tokenizer_lib.VOCAB_NAME, tokenizer_lib.SPM_NAME, tokenizer_lib.CONFIG_NAME)
    )
    tok_config: dict[str, Any] = {"model_max_length": max_length, **special}
    if model_input_names is not None:
        tok_config["model_input_names"] = list(model_input_names)
    if tokenizer.kind == "wordpiece":
        spec = wordpiece_tokenizer_json(tokenizer.vocab, tokenizer.lowercase, special)
        tok_config.update(
            tokenizer_class="BertTokenizer",
            do_lower_case=tokenizer.lowercase,
            do_basic_tokenize=True,
            tokenize_chinese_chars=True,
            strip_accents=None,
        )
    elif tokenizer.kind == HfBpeTokenizer.kind:  # its own file is transformers' tokenizer.json
        spec = None
        tok_config.update(tokenizer_class="PreTrainedTokenizerFast")
    else:
        with fs.open(os.path.join(path, tokenizer_lib.SPM_NAME), "rb") as f:
            spec = sentencepiece_tokenizer_json(f.read(), tokenizer.lowercase, special)
        tok_config.update(tokenizer_class="PreTrainedTokenizerFast")
    if spec is not None:  # one write: json.dump writes a vocabulary's file in ~10^5 pieces
        fs.write_text(os.path.join(path, TOKENIZER_JSON), json.dumps(spec, ensure_ascii=False))
    files.append(TOKENIZER_JSON)
    for name, payload in (
        ("tokenizer_config.json", tok_config),
        ("special_tokens_map.json", special),
    ):
        with fs.open(os.path.join(path, name), "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2, sort_keys=True)
            f.write("\n")
        files.append(name)
    return files


def sentencepiece_tokenizer_json(
    model_proto: bytes, lowercase: bool, special: Mapping[str, str]
) -> dict[str, Any]:
    """transformers' tokenizer.json for a SentencePiece model (the serialized ModelProto), which
    encodes as `SentencePieceTokenizer.encode` does: text lower-cased first when `lowercase`,
    special tokens (`special`: transformers' names -> pieces) matched in the raw text, each stretch
    between them normalized as the model says (its charsmap, extra spaces removed, "▁" for spaces
    and before each stretch), its pieces (Unigram, or BPE with merges ranked by piece score), and
    `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` (token types 0, then 1) around. The spelling
    follows transformers' own SentencePiece conversion (`SpmConverter.
    build_tokenizer_from_spm_proto`), written as JSON so an export needs no `tokenizers`."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_proto)
    trainer, spec = proto.trainer_spec, proto.normalizer_spec
    pieces = [(piece.piece, piece.score) for piece in proto.pieces]
    ids = {piece: i for i, (piece, _) in enumerate(pieces)}
    normal, user_defined = 1, 4  # SentencePiece's piece types
    user = [p.piece for p in proto.pieces if p.type == user_defined]
    if trainer.model_type == 1:
        model: dict[str, Any] = {
            "type": "Unigram",
            "unk_id": trainer.unk_id,
            "vocab": [[piece, score] for piece, score in pieces],
            "byte_fallback": bool(trainer.byte_fallback),
        }
    elif trainer.model_type == 2:
        ranks = {p.piece: (-p.score, i) for i, p in enumerate(proto.pieces) if p.type == normal}
        merges = sorted(
            (ranks[piece], piece[:cut], piece[cut:])
            for piece in ranks
            for cut in range(1, len(piece))
            if piece[:cut] in ranks and piece[cut:] in ranks
        )
        model = {
            "type": "BPE",
            "dropout": None,
            "unk_token": trainer.unk_piece,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": bool(trainer.byte_fallback),
            "ignore_merges": bool(user),
            "vocab": ids,
            "merges": [[left, right] for _, left, right in merges],
        }
    else:
        raise ConversionError(
            f"a SentencePiece model of type {trainer.model_type} (not unigram or BPE) has no "
            "tokenizer.json form"
        )
    normalizers: list[dict[str, Any]] = [{"type": "Lowercase"}] if lowercase else []
    if spec.precompiled_charsmap:
        charsmap = base64.b64encode(spec.precompiled_charsmap).decode("ascii")
        normalizers.append({"type": "Precompiled", "precompiled_charsmap": charsmap})
    if spec.remove_extra_whitespaces:  # spaces only: SentencePiece leaves newlines alone
        normalizers += [_replace({"Regex": r"\A +| +\z"}, ""), _replace({"Regex": " {2,}"}, " ")]
    if spec.escape_whitespaces:
        normalizers.append(_replace({"String": " "}, "▁"))
    pre_tokenizers: list[dict[str, Any]] = []
    decoders: list[dict[str, Any]] = [_replace({"String": "▁"}, " ")]
    if spec.add_dummy_prefix:  # before every stretch between special tokens, as we encode them
        normalizers.append(_replace({"Regex": r"\A▁"}, "▁▁"))
        metaspace = {"replacement": "▁", "prepend_scheme": "always", "split": False}
        pre_tokenizers.append({"type": "Metaspace", **metaspace})
        decoders += [{"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]
    if user:  # SentencePiece emits user-defined pieces whole
        pattern = "|".join(re.escape(piece) for piece in sorted(user, key=len, reverse=True))
        pre_tokenizers.append(
            {
                "type": "Split",
                "pattern": {"Regex": pattern},
                "behavior": "Isolated",
                "invert": False,
            }
        )
    return _tokenizer_json(
        ids,
        special,
        {"type": "Sequence", "normalizers": normalizers},
        {"type": "Sequence", "pretokenizers": pre_tokenizers},
        {"type": "Sequence", "decoders": decoders},
        model,
    )


def wordpiece_tokenizer_json(
    vocab: list[str], lowercase: bool, special: Mapping[str, str]
) -> dict[str, Any]:
    """transformers' tokenizer.json for a WordPiece vocabulary, as transformers' own conversion
    of BertTokenizer writes it (`BertConverter`): BERT's normalizer (lower-casing and stripping
    accents with `lowercase`, CJK characters as words), its punctuation split, "##" pieces, a
    word over 100 characters as [UNK], and the [CLS]/[SEP] template."""
    ids = {piece: i for i, piece in enumerate(vocab)}  # a repeated line: its last id, as theirs
    normalizer = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True}
    normalizer |= {"strip_accents": None, "lowercase": lowercase}
    model = {"type": "WordPiece", "unk_token": special["unk_token"]}
    model |= {"continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": ids}
    decoder = {"type": "WordPiece", "prefix": "##", "cleanup": True}
    return _tokenizer_json(ids, special, normalizer, {"type": "BertPreTokenizer"}, decoder, model)


def _tokenizer_json(
    ids: Mapping[str, int],
    special: Mapping[str, str],
    normalizer: Any,
    pre_tokenizer: Any,
    decoder: Any,
    model: dict[str, Any],
) -> dict[str, Any]:
    """A tokenizer.json around its model: the special tokens matched whole in the raw text (as
    bert-jax's `encode` does) and `[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` (token types 0, then
    1) added around."""
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
    added = [
        {"id": ids[piece], "content": piece, **flags, "special": True}
        for piece in sorted(set(special.values()), key=ids.__getitem__)
    ]
    cls, sep = special["cls_token"], special["sep_token"]

    def token(piece: str, type_id: int) -> dict[str, Any]:
        return {"SpecialToken": {"id": piece, "type_id": type_id}}

    def text(name: str, type_id: int) -> dict[str, Any]:
        return {"Sequence": {"id": name, "type_id": type_id}}

    template = {
        "type": "TemplateProcessing",
        "single": [token(cls, 0), text("A", 0), token(sep, 0)],
        "pair": [token(cls, 0), text("A", 0), token(sep, 0), text("B", 1), token(sep, 1)],
        "special_tokens": {p: {"id": p, "ids": [ids[p]], "tokens": [p]} for p in (cls, sep)},
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": template,
        "decoder": decoder,
        "model": model,
    }


def _replace(pattern: dict[str, str], content: str) -> dict[str, Any]:
    return {"type": "Replace", "pattern": pattern, "content": content}
