"""The manual's "Reproduce BERT-Base from scratch" (docs/reproduce.md), run as written on a tiny
corpus.

The recipe's shell block is read from docs/reproduce.md: its variables are pointed at a corpus
this test writes (a multistream Wikipedia dump and a books Parquet file, in a directory laid out
as the page says) and each `bert-jax` line is run in order through `bert_jax.cli.main`, every
step for real. Changes for the scale, and only these (`TINY`): step 2 on one local worker
instead of a Dataflow job (`DATAFLOW`; the same records, tests/test_data_beam.py), a
300-piece tokenizer (a tiny corpus cannot hold 30,522), Google's uncased vocab.txt (MiniLM's
copy) cut to the pieces the corpus is made of (`_vocab_for`), BERT-Tiny (2/128/2) for BERT-Base;
`plan` searches one setting per phase instead of the whole space; pretraining runs 6 steps of 8
sequences (5 at seq 128, 1 at 512) instead of 1M of 256; GLUE fine-tunes RTE alone (the
fixture's GLUE files), one learning rate, one epoch, batch 8, 32 tokens. Step 3, `plan`, reads
nothing the other steps write and compiles for a TPU slice: it is a test of its own, run by
`make test-tpu`.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import shlex
import string

import pytest

from bert_jax import cli
from bert_jax.data.sources import documents as sources
from bert_jax.data.sources.embedded import embedded_documents
from bert_jax.data.tokenizers.wordpiece import WordPieceTokenizer
from tests.corpus_fixtures import wikipedia_dump_xml, write_multistream_bz2, write_parquet
from tests.data_fixtures import minilm_vocab_path
from tests.glue_fixtures.tiny import GLUE_DIR
from tests.helpers import compile_in_process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "# Reproduce BERT-Base from scratch"
# Step 2's Beam pipeline on Dataflow (all that follows `--runner beam`): the local path here.
DATAFLOW = re.compile(r" --runner beam -- .*$")
SCALE = {
    "--vocab-size 30522": "--vocab-size 300",
    "configs/bert.py:base": "configs/bert.py:tiny",
}
# The run at tiny scale: 6 steps of 8 sequences (5 at seq 128, 1 at 512), planned as pretrained.
RUN = (
    " --config.total_steps=6 --config.phase1.batch_size=8 --config.phase2.batch_size=8"
    " --config.optimizer.warmup_steps=2 --config.eval.every_steps=0"
    " --config.checkpoint.every_steps=5 --config.log_every_steps=1"
)
TINY = {  # flags appended to each command, for the scale
    "plan": "--meshes fsdp --dtypes bfloat16 --windowed-einsum false --shard-optimizer-state false"
    " --remat none --no-verbose" + RUN,
    "pretrain": RUN,
    "glue": "--tasks RTE --learning-rates 5e-5 --epochs 1 --batch-size 8 --eval-batch-size 8"
    " --max-seq-length 32",
}


def _recipe() -> tuple[dict[str, str], list[str]]:
    """The section's variables and its `bert-jax` command lines (continuations joined)."""
    with open(os.path.join(REPO, "docs", "reproduce.md"), encoding="utf-8") as f:
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
    _vocab_for(corpus_dir, root / "vocab.txt")
    return root


def _vocab_for(corpus_dir, path) -> None:
    """Google's uncased vocab.txt (MiniLM's copy, 30,522 pieces) cut to its special tokens and
    the pieces of the corpus's sentences, in its order, written to `path`.

    WordPiece takes the longest piece of the vocabulary at each position, so a vocabulary that
    holds every piece the full one gives these sentences tokenizes them into the same pieces;
    BERT-Tiny's embedding and output layers then hold 1,419 rows instead of 30,522 (the
    update, the checkpoints and GLUE's steps a fraction as large; the recipe is the same)."""
    full = WordPieceTokenizer.from_file(minilm_vocab_path())
    documents, _ = sources.read_documents(
        [str(corpus_dir / "*.bz2"), str(corpus_dir / "books" / "*.parquet")]
    )
    used = {i for document in documents for sentence in document for i in full.encode(sentence)}
    kept = [
        token
        for i, token in enumerate(full.vocab)
        if i in used or (token.startswith("[") and not token.startswith("[unused"))
    ]
    cut = WordPieceTokenizer(kept, lowercase=True)
    for document in documents:  # the same pieces
        for sentence in document:
            assert cut.tokenize(sentence) == full.tokenize(sentence), sentence
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")


def _argv(command: str, here: dict[str, str]) -> list[str]:
    """A recipe line as `cli.main`'s arguments, at the test's scale, its variables set."""
    command = DATAFLOW.sub(" --num-workers 1", command)
    for written, tiny in SCALE.items():
        command = command.replace(written, tiny)
    argv = [string.Template(arg).substitute(here) for arg in shlex.split(command)[1:]]
    return argv + TINY.get(argv[0], "").split()


@pytest.mark.slow
def test_the_recipe_runs_as_written_at_tiny_scale(corpus, capsys):
    """Every step but 3 (`plan`, which reads nothing the others write and compiles for a TPU
    slice: the test after this one, in `make test-tpu`), in order."""
    variables, commands = _recipe()
    assert set(variables) == {"CORPUS", "DATA", "RUNS", "VOCAB", "GLUE"}
    assert [c.split()[1] for c in commands] == [
        "tokenizer", "data", "data", "plan", "pretrain", "glue"
    ]  # fmt: skip
    here = {
        "CORPUS": str(corpus / "corpus"),
        "DATA": str(corpus / "data"),
        "RUNS": str(corpus / "runs"),
        "VOCAB": str(corpus / "vocab.txt"),  # Google's uncased vocab.txt, cut (_vocab_for)
        "GLUE": GLUE_DIR,
    }
    vocab_size = len((corpus / "vocab.txt").read_text(encoding="utf-8").splitlines())
    for command in commands:
        argv = _argv(command, here)
        if argv[0] != "plan":
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

    # 4. pretrain: both phases on the records prepared in step 2, the model exported.
    run = corpus / "runs" / "bert-base"
    saved = json.loads((run / "config.json").read_text())
    assert saved["phase1"]["data"] == here["DATA"] + "/seq128"
    assert saved["phase2"]["data"] == here["DATA"] + "/seq512"
    assert saved["model"]["vocab_size"] == vocab_size < 30522 // 5
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in lines if m["kind"] == "train"]
    assert [(m["step"], m["seq_len"]) for m in train] == [(s, 128) for s in range(1, 6)] + [
        (6, 512)
    ]
    assert all(math.isfinite(m["loss"]) and m["skipped_steps_total"] == 0 for m in train)
    assert (run / "checkpoints" / "6").is_dir() and (run / "model" / "config.json").is_file()
    # 5. GLUE on the pretrained workdir: RTE's dev score and its submission file.
    glue = corpus / "runs" / "glue-base"
    results = json.loads((glue / "results.json").read_text())
    assert results["protocol"]["model"] == str(run)
    assert 0.0 <= results["summary"]["columns"]["RTE"] <= 100.0
    test_rows = (pathlib.Path(GLUE_DIR) / "RTE" / "test.tsv").read_text().splitlines()
    assert len((glue / "submission" / "RTE.tsv").read_text().splitlines()) == len(test_rows)


@pytest.mark.tpu_compile
def test_the_recipes_plan_runs_as_written_at_tiny_scale(capsys, monkeypatch):
    """Step 3: `plan` searches the slice for both phases (compiled for v5p-8 with libtpu)."""
    compile_in_process(monkeypatch)  # plan's compiles in this process (tests/helpers.py)
    _, commands = _recipe()
    (command,) = [c for c in commands if c.split()[1] == "plan"]
    capsys.readouterr()
    assert cli.main(_argv(command, {})) == 0, (command, capsys.readouterr().err)
    out = capsys.readouterr().out
    # A winner for each phase, with the flags to run it (the data paths are not its to set).
    assert "phase1: 5 steps" in out and "phase2: 1 steps" in out and "fsdp (1, 4, 1)" in out
    assert "--config.phase1.data" not in out
