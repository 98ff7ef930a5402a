"""README's "Reproduce BERT-Base from scratch", run as written on a tiny corpus.

The recipe's shell block is read from README.md: its variables are pointed at a corpus this test
writes (a multistream Wikipedia dump and a books Parquet file, in a directory laid out as the
README says) and each `bert-jax` line is run in order through `bert_jax.cli.main`. Changes for the
scale, and only these: one worker instead of 16, a 300-piece tokenizer (a tiny corpus cannot
hold 30,522), and pretraining is resolved against the prepared records with `--dry-run` (the
training loop on records is `tests/test_pretrain.py`'s, GLUE's `tests/test_finetune_sweep.py`'s;
the suite's time budget leaves no room to repeat them here). `plan` compiles for a TPU: only
parsed, as every README command line is in `tests/test_readme.py`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import string

import pytest

from bert_jax import cli
from bert_jax.data.embedded import embedded_documents
from tests.corpus_fixtures import wikipedia_dump_xml, write_multistream_bz2, write_parquet
from tests.data_fixtures import minilm_vocab_path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "## Reproduce BERT-Base from scratch"
SCALE = {"--num-workers 16": "--num-workers 1", "--vocab-size 30522": "--vocab-size 300"}


def _recipe() -> tuple[dict[str, str], list[str]]:
    """The section's variables and its `bert-jax` command lines (continuations joined)."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index(SECTION) :]
    block = re.search(r"^```sh\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL).group(1)
    variables, commands = {}, []
    for line in block.replace("\\\n", " ").splitlines():
        line = line.split(" #", 1)[0].strip()
        if re.match(r"^[A-Z_]+=", line):
            name, _, value = line.partition("=")
            variables[name] = value
        elif line.startswith("bert-jax "):
            commands.append(" ".join(line.split()))
    return variables, commands


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("recipe")
    corpus_dir = root / "corpus"
    (corpus_dir / "books").mkdir(parents=True)
    dump = corpus_dir / "enwiki-20240501-pages-articles-multistream1.xml-p1p41242.bz2"
    write_multistream_bz2(dump, wikipedia_dump_xml())
    # Books: the embedded corpus's documents, a paragraph per line, two files.
    books = ["\n".join(document) for document in embedded_documents("train")[:24]]
    write_parquet(corpus_dir / "books" / "books-00000-of-00002.parquet", books[:12])
    write_parquet(corpus_dir / "books" / "books-00001-of-00002.parquet", books[12:])
    return root


def test_the_recipe_runs_as_written_at_tiny_scale(corpus, capsys):
    variables, commands = _recipe()
    assert set(variables) == {"CORPUS", "DATA", "RUNS", "VOCAB", "GLUE"}
    assert [c.split()[1] for c in commands] == [
        "tokenizer", "data", "data", "plan", "pretrain", "glue"
    ]  # fmt: skip
    here = {
        "CORPUS": str(corpus / "corpus"),
        "DATA": str(corpus / "data"),
        "RUNS": str(corpus / "runs"),
        "VOCAB": minilm_vocab_path(),  # an uncased 30,522-piece vocab.txt, as Google's
        "GLUE": str(corpus / "glue"),
    }
    for command in commands:
        for written, tiny in SCALE.items():
            command = command.replace(written, tiny)
        argv = [string.Template(arg).substitute(here) for arg in shlex.split(command)[1:]]
        if argv[0] == "plan":
            continue
        if argv[0] == "glue":
            assert cli.build_parser().parse_args(argv).model == here["RUNS"] + "/bert-base"
            continue
        if argv[0] == "pretrain":
            argv.append("--dry-run")
        assert cli.main(argv) == 0, (command, capsys.readouterr().err)

    out = capsys.readouterr().out
    assert "--config.phase1.data" not in out and here["DATA"] + "/seq512" in out
    tokenizer = json.loads((corpus / "data" / "tokenizer" / "bert_jax_tokenizer.json").read_text())
    assert tokenizer["lowercase"] is True
    for length in (128, 512):
        records = corpus / "data" / f"seq{length}"
        recorded = json.loads((records / "prepare_config.json").read_text())
        assert recorded["max_seq_length"] == length and recorded["splitter"].startswith("syntok")
        stats = json.loads((records / "stats-0-of-1.json").read_text())
        assert stats["corpus"]["documents"] == 2 + 24 and stats["corpus"]["skipped_pages"] == 5
        assert sorted(p.name for p in records.glob("part-*.tfrecord"))
