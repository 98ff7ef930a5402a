"""`bert-jax tokenizer train` says what it reads, how many sentences, and when training starts
and ends (with its time)."""

from __future__ import annotations

import json
import os
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


def _prose(path, documents: int = 12):
    """A few KB of real prose (the embedded corpus), one sentence a line."""
    from bert_jax.data.sources import embedded as corpus

    sentences = [s for d in corpus.embedded_documents("train")[:documents] for s in d]
    path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    return path


def test_a_size_the_corpus_cannot_support_says_the_largest_and_leaves_nothing(tmp_path, capsys):
    corpus = _prose(tmp_path / "prose.txt")
    output = tmp_path / "new" / "tok"  # neither directory exists yet
    argv = ["tokenizer", "train", "--input", str(corpus), "--vocab-size", "30522"]
    assert cli.main([*argv, "--output", str(output)]) == 2
    error = capsys.readouterr().err.strip()
    match = re.fullmatch(
        r"bert-jax tokenizer train: error: --vocab-size 30522 is more than (\S+) supports: "
        r"SentencePiece's unigram model finds at most ([\d,]+) pieces in it \(the five special "
        r"tokens included\); give --vocab-size (\d+) or less, or train on more text",
        error,
    )
    assert match, error
    assert match.group(1) == str(corpus) and ".spm-train" not in error
    largest = int(match.group(3))
    assert match.group(2) == f"{largest:,}" and 100 < largest < 30522
    assert not (tmp_path / "new").exists()  # nor the parent made for it

    # The size it names is one the corpus supports.
    argv[-1] = str(largest)
    assert cli.main([*argv, "--output", str(output)]) == 0
    assert f"wrote SentencePieceTokenizer(vocab_size={largest}," in capsys.readouterr().out


def test_a_failed_training_keeps_a_directory_it_did_not_create(tmp_path, capsys):
    corpus = tmp_path / "prose.jsonl"  # read into a temporary sentences file first
    corpus.write_text(json.dumps({"text": " ".join(SENTENCES)}) + "\n")
    output = tmp_path / "mine"
    output.mkdir()
    (output / "notes.txt").write_text("the user's own file\n")
    argv = ["tokenizer", "train", "--input", str(corpus), "--vocab-size", "5000"]
    assert cli.main([*argv, "--output", str(output)]) == 2
    error = capsys.readouterr().err
    assert f"--vocab-size 5000 is more than {corpus} supports" in error
    assert ".sentences-" not in error and len(error.strip().splitlines()) == 1
    assert sorted(os.listdir(output)) == ["notes.txt"]  # kept, and nothing of ours left


def test_a_size_below_the_corpus_characters_says_the_smallest(tmp_path, capsys):
    corpus = _prose(tmp_path / "prose.txt")
    argv = ["tokenizer", "train", "--input", str(corpus), "--output", str(tmp_path / "tok")]
    assert cli.main([*argv, "--vocab-size", "30"]) == 2
    error = capsys.readouterr().err.strip()
    match = re.search(r"take ([\d,]+) pieces; give --vocab-size (\d+) or more", error)
    assert match and f"--vocab-size 30 is less than {corpus} needs" in error, error
    assert not (tmp_path / "tok").exists()
    assert cli.main([*argv, "--vocab-size", match.group(2)]) == 0  # the smallest it supports


def test_a_setting_out_of_its_range_is_refused_before_anything_is_read(tmp_path, capsys):
    """The declared ranges (data/tokenizers/train_settings.py) are checked first: the missing
    input is not what the error names."""
    missing = str(tmp_path / "missing.txt")
    argv = ["tokenizer", "train", "--input", missing, "--output", str(tmp_path / "tok")]
    for given, error in [
        (["--vocab-size", "5"], "--vocab-size 5 must be >= 6"),
        (["--vocab-size", "40", "--character-coverage", "0.5"], "--character-coverage 0.5 "),
        (["--vocab-size", "40", "--input-sentence-size", "50"], "--input-sentence-size 50 "),
    ]:
        assert cli.main([*argv, *given]) == 2
        assert capsys.readouterr().err.startswith(f"bert-jax tokenizer train: error: {error}")
    assert not (tmp_path / "tok").exists()


def test_the_settings_of_a_run_that_trains_its_own_name_its_config_key():
    from bert_jax.data.tokenizers.interface import SPECIAL_TOKENS
    from bert_jax.data.tokenizers.train_settings import TokenizerTrainSettings
    from bert_jax.runtime import declarations
    from bert_jax.runtime.errors import UserError

    # The smallest size: the special tokens and one piece of text.
    smallest = declarations.declarations(TokenizerTrainSettings)["vocab_size"].low
    assert smallest == len(SPECIAL_TOKENS) + 1
    try:
        TokenizerTrainSettings(3).check("config.data.tokenizer_vocab_size")
    except UserError as err:
        assert str(err) == "config.data.tokenizer_vocab_size 3 must be >= 6"
    else:
        raise AssertionError("a size of 3 was accepted")


def test_a_sample_of_the_sentences_is_said_and_zero_takes_them_all(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"{s} ({i})\n" for i in range(30) for s in SENTENCES))
    argv = ["tokenizer", "train", "--input", str(corpus), "--vocab-size", "60"]
    for size, said in (("101", "(a sample of 101 of them)"), ("0", "on 120 sentences, ")):
        output = str(tmp_path / f"tok{size}")
        assert cli.main([*argv, "--output", output, "--input-sentence-size", size]) == 0
        assert said in _lines(capsys)[1]
