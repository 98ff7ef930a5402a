"""Every `bert-jax` command in README.md and docs/*.md runs: as written in a sandbox (in small
form where the table below says so), or, where it needs a TPU or a bucket, as its dry run, which
must start no process, compile nothing and write nothing.

How a command is run is decided by `default_mark` (by subcommand), or by a mark the page puts on
the line before a code block, which holds for the block's commands (docs/development.md):

    <!-- test: run -->              as written, in the sandbox
    <!-- test: small ARGS -->       with ARGS added (argparse and absl keep the last value)
    <!-- test: dry-run -->          with --dry-run added: nothing started, compiled or written
    <!-- test: elsewhere TEST -->   not run here: TEST (a file under tests/) runs it as written

Each command runs in a directory of its own, where the paths it reads (`--model runs/base`,
`--data glue_data`, `--input 'corpus/*.txt'`, ...) are links to tiny inputs built once
(`inputs`): a 300-piece tokenizer and records of 60 documents, a 1-layer model that carries that
tokenizer, a TF1 checkpoint, a Hugging Face directory, and GLUE, SQuAD, CoNLL-2003 and SWAG files
of a few rows (each command's cost is its compiles: the smallest inputs that run it).
Commands that differ only in their paths run once (`signature`); tests/test_readme.py parses
every command.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import multiprocessing
import os
import re
import shlex
import subprocess

import pytest

from bert_jax import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(
    os.path.join("docs", name)
    for name in os.listdir(os.path.join(REPO, "docs"))
    if name.endswith(".md")  # not docs/images/
)
MARK = re.compile(r"^<!--\s*test:\s*(.*?)\s*-->\s*$")
KINDS = ("run", "small", "dry-run", "elsewhere")

# The small form of each command that trains or reads a corpus (flags a user would pass on a
# laptop): one worker, one epoch of 32-token sequences, one GLUE task and learning rate.
FINETUNE_SMALL = ["--epochs", "1", "--batch-size", "8", "--eval-batch-size", "8"]
FINETUNE_SMALL += ["--max-seq-length", "32"]
SMALL = {
    "tokenizer train": ["--vocab-size", "300"],
    "data prepare": ["--num-workers", "1", "--dupe-factor", "1"],
    "finetune": FINETUNE_SMALL,
    "glue": [*FINETUNE_SMALL, "--tasks", "RTE", "--learning-rates", "5e-5", "--seeds", "0"],
    "eval": ["--batch-size", "8", "--batches", "2"],
    "encode": ["--max-seq-length", "32"],
}


@dataclasses.dataclass(frozen=True)
class Command:
    page: str
    line: int
    argv: tuple[str, ...]  # after `bert-jax`
    mark: tuple[str, ...]  # (kind, *args)

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line} {' '.join(self.argv)[:50]}"

    @property
    def subcommand(self) -> str:
        two = " ".join(self.argv[:2])
        return two if two in ("tokenizer train", "data prepare") else self.argv[0]


def default_mark(argv: tuple[str, ...]) -> tuple[str, ...]:
    """How a command without a mark runs: what rents, reads a bucket or compiles for a TPU is a
    dry run (`plan`'s says its search; the search compiles in make test-tpu); `bench` runs in its
    own tests; `pretrain` of a size config runs for days, so its dry run prints the recipe; the
    rest runs, in small form."""
    if argv[0] == "launch" or any("gs://" in arg for arg in argv) or "--topology" in argv:
        return ("dry-run",)
    if argv[0] == "bench":
        return ("elsewhere", "tests/test_bench.py")
    if argv[0] == "pretrain":
        return ("dry-run",)
    return ("small",)


def _commands() -> list[Command]:
    found = []
    for page in PAGES:
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            lines = f.read().splitlines()
        mark, in_block, previous = None, False, ""
        joined, start, loop = "", 0, None
        for number, line in enumerate(lines, 1):
            if line.startswith("```"):
                in_block = not in_block
                mark = MARK.match(previous) if in_block else None
                previous = line
                continue
            previous = line if line.strip() else previous
            if not in_block:
                continue
            if not joined:
                start = number
            joined += line[:-1] + " " if line.endswith("\\") else line
            if line.endswith("\\"):
                continue
            text, joined = joined.strip(), ""
            # `for v in A B C; do ... $v ...; done` runs its body once, with the first value.
            loop_head = re.match(r"^for (\w+) in (\S+).*; do$", text)
            if loop_head:
                loop = loop_head.groups()
            elif text == "done":
                loop = None
            elif loop:
                text = text.replace(f"${{{loop[0]}}}", loop[1]).replace(f"${loop[0]}", loop[1])
            if not text.startswith(("bert-jax ", ".venv/bin/bert-jax ")):
                continue
            argv = tuple(shlex.split(text, comments=True)[1:])
            given = tuple(mark.group(1).split()) if mark else default_mark(argv)
            found.append(Command(page, start, argv, given))
    return found


COMMANDS = _commands()


def test_every_mark_is_known():
    for command in COMMANDS:
        kind = command.mark[0] if command.mark else ""
        assert kind in KINDS, f"{command.name}: mark {command.mark}; use one of {KINDS}"
        if kind == "elsewhere":
            assert len(command.mark) == 2 and os.path.isfile(os.path.join(REPO, command.mark[1]))


def signature(command: Command) -> tuple:
    """What a run tests beyond parsing: the subcommand, the task family or conversion and the
    flags given; paths and values aside (every path leads to the same tiny inputs)."""
    argv = command.argv
    task = argv[argv.index("--task") + 1].split("/")[0] if "--task" in argv else ""
    direction = argv[argv.index("--from") + 1] if "--from" in argv else ""
    flags = sorted({a.split("=")[0] for a in argv if a.startswith("-")})
    return (command.subcommand, task, direction, *flags, command.mark)


def _first_of_each_signature() -> list[Command]:
    seen, first = set(), []
    for command in COMMANDS:
        if command.mark[0] in ("run", "small", "dry-run") and signature(command) not in seen:
            seen.add(signature(command))
            first.append(command)
    return first


RUN = _first_of_each_signature()


# --- the tiny inputs ---------------------------------------------------------------------------


def _write_squad(directory, version: str, words: list[str]) -> None:
    paragraphs = []
    for index in range(8):
        context = " ".join(words[(index + k) % len(words)] for k in range(12)) + "."
        answer = context.split()[3]
        qa = {"id": f"q{index}", "question": f"where is {words[index]}?"}
        impossible = version == "v2.0" and index % 3 == 0
        qa["answers"] = (
            [] if impossible else [{"text": answer, "answer_start": context.index(answer)}]
        )
        if version == "v2.0":
            qa["is_impossible"] = impossible
        paragraphs.append({"context": context, "qas": [qa]})
    payload = json.dumps({"version": version, "data": [{"title": "t", "paragraphs": paragraphs}]})
    for split in ("train", "dev"):
        (directory / f"{split}-{version}.json").write_text(payload, encoding="utf-8")


def _write_conll(directory, words: list[str]) -> None:
    lines = ["-DOCSTART- -X- -X- O", ""]
    for index in range(8):
        lines += [f"{words[(index + k) % len(words)]} X X O" for k in range(4)]
        lines += [f"{words[index].capitalize()} NNP I-NP I-PER", ""]
    text = "\n".join(lines) + "\n"
    for name in ("eng.train", "eng.testa", "eng.testb"):
        (directory / name).write_text(text, encoding="utf-8")


def _write_swag(directory, words: list[str]) -> None:
    import csv

    from bert_jax.finetune.tasks import swag

    for name in ("train.csv", "val.csv"):
        with open(directory / name, "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(swag.HEADER)
            for index in range(8):
                endings = [" ".join(words[index + k : index + k + 3]) for k in range(4)]
                start = f"{words[index]} {words[index + 1]}"
                writer.writerow([index, f"v{index}", index, start, words[index], words[index + 1],
                                 "gold", *endings, index % 4])  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """Role -> path of a tiny input; `_materialize` links a command's read paths to these."""
    from bert_jax.convert import model_dir
    from bert_jax.data.sources.embedded import embedded_documents
    from tests import convert_fixtures
    from tests.glue_fixtures.tiny import GLUE_DIR
    from tests.helpers import tiny_config

    root = tmp_path_factory.mktemp("docs_inputs")
    paths = {"glue": GLUE_DIR}
    corpus = root / "corpus"
    corpus.mkdir()
    documents = embedded_documents("all")[:60]
    for shard in range(3):
        text = "\n\n".join("\n".join(doc) for doc in documents[shard::3])
        (corpus / f"part-{shard}.txt").write_text(text + "\n", encoding="utf-8")
    paths["corpus"] = str(corpus)
    paths["sentences"] = str(root / "sentences.txt")
    sentences = [s for doc in documents[:4] for s in doc][:16]
    (root / "sentences.txt").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    quiet = []
    for argv in (
        ["tokenizer", "train", "--input", f"{corpus}/*.txt", "--vocab-size", "300"]
        + ["--output", str(root / "tok"), "--lowercase"],
        *(
            ["data", "prepare", "--input", f"{corpus}/*.txt", "--tokenizer", str(root / "tok")]
            + ["--output", str(root / f"data{length}"), "--max-seq-length", str(length)]
            + ["--max-predictions-per-seq", str(length // 8), "--dupe-factor", "1"]
            for length in (128, 512)
        ),
    ):
        quiet.append(cli.main(argv))
    assert quiet == [0, 0, 0]
    paths.update(tok=str(root / "tok"), records128=str(root / "data128"))
    paths["records512"] = str(root / "data512")

    config = tiny_config(vocab_size=320, max_position_embeddings=512, num_hidden_layers=1)
    params = convert_fixtures.random_params(config)
    paths["model"] = model_dir.save_model_dir(root / "model", config, params, root / "tok")
    paths["tf1"] = convert_fixtures.write_tf1_checkpoint(
        str(root / "tf1"),
        convert_fixtures.tf1_arrays(tiny_config()),
        convert_fixtures.google_bert_config(tiny_config()),
        vocab_size=tiny_config().vocab_size,
    )
    assert (
        cli.main(["convert", "--from", "bert-jax", paths["model"], "--to", "hf", str(root / "hf")])
        == 0
    )
    paths["hf"] = str(root / "hf")

    words = [w for doc in documents for s in doc for w in s.lower().split() if w.isalpha()][:40]
    for role, write in (("squad", None), ("conll", _write_conll), ("swag", _write_swag)):
        directory = root / role
        directory.mkdir()
        if write is None:
            _write_squad(directory, "v1.1", words)
            _write_squad(directory, "v2.0", words)
        else:
            write(directory, words)
        paths[role] = str(directory)
    return paths


def _data_role(command: Command) -> str:
    argv = command.argv
    if command.subcommand == "eval":
        return "records128"
    if command.subcommand == "glue":
        return "glue"
    task = argv[argv.index("--task") + 1] if "--task" in argv else ""
    return {"squad": "squad", "conll2003": "conll", "swag": "swag"}.get(task.split("/")[0], "glue")


def _reads(command: Command) -> list[tuple[str, str]]:
    """(path as written, input role) for every path the command reads."""
    argv, reads = command.argv, []
    for i, arg in enumerate(argv[:-1]):
        value = argv[i + 1]
        if arg == "--model":
            reads.append((value, "model"))
        elif arg == "--tokenizer":
            reads.append((value, "tok"))
        elif arg == "--data":
            reads.append((value, _data_role(command)))
        elif arg == "--from":
            reads.append((argv[i + 2], {"tf1": "tf1", "hf": "hf"}.get(value, "model")))
        elif arg == "--input":
            for item in argv[i + 1 :]:
                if item.startswith("-"):
                    break
                if command.subcommand == "encode":
                    reads.append((item, "sentences"))
                else:  # a glob of corpus files: its directory is the corpus
                    reads.append((os.path.dirname(item) or ".", "corpus"))
    for arg in argv:
        for phase, role in (("phase1", "records128"), ("phase2", "records512")):
            if arg.startswith(f"--config.{phase}.data="):
                reads.append((arg.split("=", 1)[1], role))
    return reads


def _materialize(command: Command, inputs: dict[str, str], cwd) -> None:
    for path, role in _reads(command):
        if "://" in path or path in (".", ""):
            continue
        link = cwd / path
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(inputs[role])


def _tree(root) -> set[str]:
    return {
        os.path.relpath(os.path.join(d, n), root)
        for d, dirs, files in os.walk(root)
        for n in dirs + files
    }


COMPILES: list[str] = []


@pytest.fixture(scope="module")
def compile_events():
    import jax

    jax.monitoring.register_event_duration_secs_listener(
        lambda event, *_, **__: (
            COMPILES.append(event)
            if event == "/jax/core/compile/backend_compile_duration"
            else None
        )
    )
    return COMPILES


def _forbid_processes(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError(f"a dry run started a process: {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(multiprocessing.Process, "start", refuse)


@pytest.mark.parametrize("command", RUN, ids=[c.name for c in RUN])
def test_a_documented_command_runs(command, inputs, compile_events, tmp_path, monkeypatch, capsys):
    kind, *extra = command.mark
    argv = list(command.argv)
    if kind == "small":
        argv += [*SMALL.get(command.subcommand, ()), *extra]
        if "--features" in argv:  # the feature-based tagger's BiLSTM, 768 units each way
            argv += ["--lstm-size", "16"]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    _materialize(command, inputs, cwd)
    # Config paths in the pages are relative to the repository, as for a user in a checkout.
    (cwd / "configs").mkdir(exist_ok=True)
    for config in glob.glob(os.path.join(REPO, "configs", "*.py")):
        (cwd / "configs" / os.path.basename(config)).symlink_to(config)
    monkeypatch.chdir(cwd)
    if kind == "dry-run":
        # Before a launcher's `--` (what follows it is pretrain's).
        argv.insert(argv.index("--") if "--" in argv else len(argv), "--dry-run")
        before, compiled = _tree(cwd), len(compile_events)
        _forbid_processes(monkeypatch)
    code = cli.main(argv)
    out = capsys.readouterr()
    assert code == 0, f"{shlex.join(argv)}: exit status {code}\n{out.err[-2000:]}"
    if kind == "dry-run":
        assert len(compile_events) == compiled, "the dry run compiled"
        assert _tree(cwd) == before, "the dry run wrote"
