"""`bert-jax tokenizer train` says what it reads, how many sentences, and when training starts
and ends (with its time)."""

from __future__ import annotations

import json
import re

from bert_jax import cli

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A stitch in time saves nine, they said.",
    "Rain fell on the hills all through the night.",
    "She read the letter twice before answering.",
]


def _lines(capsys) -> list[str]:
    return capsys.readouterr().out.strip().splitlines()


def test_text_files_are_counted_and_the_training_timed(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES[:2]) + "\n\n" + "\n".join(SENTENCES[2:]) + "\n")
    argv = ["tokenizer", "train", "--input", str(corpus), "--vocab-size", "40"]
    assert cli.main([*argv, "--output", str(tmp_path / "tok")]) == 0
    lines = _lines(capsys)
    assert lines[0] == f"tokenizer train: reading 1 text file(s) as they are: {corpus}"
    assert lines[1] == (
        "tokenizer train: training SentencePiece (unigram, 40 pieces) on 4 sentences, "
        + lines[1].rsplit(", ", 1)[1]
    )
    assert re.fullmatch(r"tokenizer train: trained in \d+\.\d s", lines[2])
    assert lines[3].startswith("wrote SentencePieceTokenizer(vocab_size=40")


def test_a_corpus_read_by_the_readers_says_its_documents_and_sentences(tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    documents = [" ".join(SENTENCES[:2]), " ".join(SENTENCES[2:])]
    corpus.write_text("".join(json.dumps({"text": text}) + "\n" for text in documents))
    argv = ["tokenizer", "train", "--input", str(corpus), "--vocab-size", "40"]
    assert cli.main([*argv, "--output", str(tmp_path / "tok")]) == 0
    lines = _lines(capsys)
    assert lines[0] == f"tokenizer train: reading {corpus} into sentences"
    assert re.fullmatch(r"tokenizer train: read 2 documents, 4 sentences in \d+\.\d s", lines[1])
    assert "on 4 sentences" in lines[2] and lines[3].startswith("tokenizer train: trained in")
