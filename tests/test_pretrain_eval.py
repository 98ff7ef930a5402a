"""Whether and on what each phase of a pretraining run evaluates, and the vocabulary it gets
(issues 57 and 58): one decision (eval_choice.eval_choices, inputs.vocab_choice) that the dry run's
outline, the run's first line and the loop all read; prepared records evaluate on their own
held-out records (`<records>/heldout`) when config.eval.source is not set."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from bert_jax import cli
from bert_jax.data import layout
from bert_jax.training import (
    config_checks,
    config_lib,
    eval_choice,
    inputs,
    metric_writers,
    plots,
    pretrain,
)
from tests.data_fixtures import SPM_VOCAB_SIZE, embedded_spm_dir
from tests.helpers import ONE_LAYER_MODEL, pretraining_config


def _prepare(output: str) -> None:
    argv = ["data", "prepare", "--input", "embedded:eval", "--tokenizer", embedded_spm_dir()]
    argv += ["--output", output, "--max-seq-length", "32", "--max-predictions-per-seq", "5"]
    assert cli.main([*argv, "--dupe-factor", "1"]) == 0


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """Records at length 32 with complete held-out records; the same without any, and with
    held-out records whose preparation did not finish (no completion mark)."""
    root = tmp_path_factory.mktemp("eval_choice")
    full = str(root / "records")
    _prepare(full)
    if not os.path.isdir(layout.heldout_dir(full)):  # too few documents to hold some out
        _prepare(layout.heldout_dir(full))
    bare = str(root / "bare")
    shutil.copytree(full, bare, ignore=shutil.ignore_patterns(layout.HELDOUT_SUBDIR))
    incomplete = str(root / "incomplete")
    shutil.copytree(full, incomplete)
    held = layout.heldout_dir(incomplete)
    for name in os.listdir(held):
        if name.startswith("stats-"):
            os.remove(os.path.join(held, name))
    return {"full": full, "bare": bare, "incomplete": incomplete, "root": root}


def _config(source: str = "embedded", **overrides):
    eval_settings = {"eval.batches": 2, "eval.batch_size": 8}
    return pretraining_config(200, **{"data.source": source, **eval_settings, **overrides})


def _outline(config) -> list[str]:
    """The dry run's evaluation lines: the one after the intervals line, and those under it."""
    lines = config_checks.dry_run_outline(config).split("\n")
    start = next(i for i, line in enumerate(lines) if "a metrics line every" in line) + 1
    block = [lines[start]]
    block += [line for line in lines[start + 1 :] if line.startswith("    ")]
    return [line.strip() for line in block]


def _cases(records):
    full, bare, incomplete = records["full"], records["bare"], records["incomplete"]
    heldout = layout.heldout_dir(full)
    unset = "and config.eval.source is not set"
    count = eval_choice._prepared_instances(heldout)  # as data prepare counted them
    whole = count // 8
    assert whole >= 2  # the other cases' 2 batches of 8 fit
    return [
        (
            _config(full),
            [
                f"phase1: at step 100 on {heldout} (the held-out records of {full})",
                f"phase2: at step 200 on {heldout} (the held-out records of {full})",
            ],
        ),
        (_config(bare), f"no eval ({bare} has no held-out records (heldout/) {unset})"),
        (
            _config(incomplete),
            f"no eval (the held-out records {layout.heldout_dir(incomplete)} are incomplete "
            f"{unset})",
        ),
        (
            _config(),
            [
                "phase1: at step 100 on embedded:eval (the embedded corpus's held-out split)",
                "phase2: at step 200 on embedded:eval (the embedded corpus's held-out split)",
            ],
        ),
        (
            _config(bare, **{"eval.source": full}),
            [
                f"phase1: at step 100 on {full} (config.eval.source)",
                f"phase2: at step 200 on {full} (config.eval.source)",
            ],
        ),
        (_config(full, **{"eval.every_steps": 0}), "no eval (config.eval.every_steps=0)"),
        (_config(""), "no eval (no data is named)"),  # the run refuses it; the dry run says
        (
            _config(
                full, **{"phase2.fraction": 0.0, "phase1.fraction": 1.0, "eval.batch_size": 1024}
            ),
            [
                f"phase1: at 2 steps (100..200) on {heldout} (the held-out records of {full}); its "
                f"{count} instances are fewer than a batch of 1024: some count twice",
            ],
        ),
        (
            _config(full, **{"eval.batches": 1000}),  # more than the held-out records hold
            [
                f"phase1: at step 100 on {heldout} (the held-out records of {full}); {whole} "
                f"batches, as many as its {count} instances fill",
                f"phase2: at step 200 on {heldout} (the held-out records of {full}); {whole} "
                f"batches, as many as its {count} instances fill",
            ],
        ),
        (
            _config("/corpus.txt", **{"phase1.data": full, "phase2.data": "/corpus.txt"}),
            [
                f"phase1: at step 100 on {heldout} (the held-out records of {full})",
                "phase2: at step 200 on /corpus.txt (the held-out records set aside when "
                "/corpus.txt is prepared)",
            ],
        ),
        (
            _config(full, **{"total_steps": 1000, "eval.every_steps": 950}),
            [
                "phase1: no eval (no eval step falls in its steps 0..899)",
                f"phase2: at 2 steps (950..1000) on {heldout} (the held-out records of {full})",
            ],
        ),
    ]


def test_the_dry_run_and_the_first_line_say_the_runs_one_eval_decision(records):
    for config, expected in _cases(records):
        phases = config_lib.split_phases(config)
        summary, per_phase = eval_choice.eval_outline(config, phases)
        # The dry run says what the run's first line says, and each phase's source and why.
        assert _outline(config) == [summary, *per_phase]
        assert f", {summary}; workdir /w" in pretrain.opening_line(config, "/w")
        if isinstance(expected, str):
            assert summary == expected
            assert not any(c.source for c in eval_choice.eval_choices(config, phases))
        else:
            assert summary.startswith(f"eval every {config.eval.every_steps} steps and at the end")
            assert per_phase == expected


def _run_config(source: str, **overrides):
    """One tiny phase at length 32 on `source`, the vocabulary left to the tokenizer."""
    config = _config(
        source,
        **{
            "total_steps": 4,
            "phase1.fraction": 1.0,
            "phase2.fraction": 0.0,
            **ONE_LAYER_MODEL,
            "optimizer.warmup_steps": 1,
            "data.shuffle_buffer_size": 100,
            "eval.every_steps": 2,
            "eval.batches": 2,
            "eval.batch_size": 8,
            "checkpoint.every_steps": 4,
            "log_every_steps": 1,
            "export_model": False,
            **overrides,
        },
    )
    assert config.model.vocab_size == config_lib.FOLLOW_TOKENIZER
    return config


def test_a_run_on_records_evaluates_on_their_held_out_records_as_said(records, capsys):
    config = _run_config(records["full"])
    phases = config_lib.split_phases(config)
    (choice,) = eval_choice.eval_choices(config, phases)
    assert choice.source == layout.heldout_dir(records["full"]) and choice.steps == (2, 4)
    workdir = str(records["root"] / "run-heldout")
    result = pretrain.pretrain(config, workdir)
    out = capsys.readouterr().out
    assert f", vocab {SPM_VOCAB_SIZE} (from the tokenizer); " in out.split("\n")[0]
    assert "eval every 2 steps and at the end" in out.split("\n")[0]
    evals = metric_writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"), "eval")
    assert [row["step"] for row in evals] == list(choice.steps)
    for row in evals:
        assert {"mlm_accuracy", "mlm_baseline_accuracy", "mlm_perplexity", "nsp_accuracy"} <= set(
            row
        )
    assert "eval step 2: mlm accuracy " in out and "(most frequent token " in out
    assert result.last_eval["mlm_baseline_accuracy"] > 0
    # The model's vocabulary is the tokenizer's, written down for resumes and exports.
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
        assert json.load(f)["model"]["vocab_size"] == SPM_VOCAB_SIZE
    again = pretrain.pretrain(_run_config(records["full"]), workdir)  # same command: resumes
    assert again.final_step == 4


def test_a_run_on_records_without_held_out_records_evaluates_nothing_and_draws_no_eval(
    records, capsys
):
    config = _run_config(records["bare"], total_steps=2)
    workdir = str(records["root"] / "run-bare")
    result = pretrain.pretrain(config, workdir)
    first = capsys.readouterr().out.split("\n")[0]
    assert f"no eval ({records['bare']} has no held-out records (heldout/)" in first
    jsonl = os.path.join(workdir, "metrics.jsonl")
    assert metric_writers.read_jsonl(jsonl, "eval") == [] and result.last_eval == {}
    figure = plots.draw(metric_writers.read_jsonl(jsonl, "train"), [], "run")
    labels = [label for axes in figure.axes for label in axes.get_legend_handles_labels()[1]]
    assert not [label for label in labels if "held-out" in label or "most frequent" in label]
    assert "train" in labels


def test_a_run_on_a_corpus_evaluates_on_what_its_preparation_held_out(records, capsys):
    from bert_jax.data.sources import embedded as sources

    corpus = records["root"] / "corpus.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        for document in sources.embedded_documents("train"):
            f.write("\n".join(document) + "\n\n")
    config = _run_config(str(corpus), total_steps=2, **{"data.tokenizer": embedded_spm_dir()})
    (choice,) = eval_choice.eval_choices(config, config_lib.split_phases(config))
    assert choice.of_prepared_corpus and choice.steps == (2,)
    workdir = str(records["root"] / "run-corpus")
    pretrain.pretrain(config, workdir)
    out = capsys.readouterr().out
    assert "eval every 2 steps and at the end" in out.split("\n")[0]
    assert "eval step 2: mlm accuracy " in out
    (evaluation,) = metric_writers.read_jsonl(os.path.join(workdir, "metrics.jsonl"), "eval")
    assert evaluation["step"] == 2 and "mlm_baseline_accuracy" in evaluation
    # What it evaluated on: the held-out records beside the prepared ones, which the training
    # records do not hold.
    (prepared,) = [p for p in (records["root"] / "run-corpus" / "data").iterdir()]
    held = json.loads((prepared / layout.HELDOUT_SUBDIR / layout.CONFIG_FILE).read_text())
    assert held["heldout"] is True


def test_a_corpus_too_small_to_hold_documents_out_is_said_and_not_evaluated(records):
    from bert_jax.data.sources import embedded as sources
    from bert_jax.data.tokenizers.load_or_train import load_tokenizer

    corpus = records["root"] / "five-documents.txt"
    with open(corpus, "w", encoding="utf-8") as f:
        for document in sources.embedded_documents("train")[:5]:
            f.write("\n".join(document) + "\n\n")
    config = _run_config(str(corpus), **{"data.tokenizer": embedded_spm_dir()})
    (phase,) = config_lib.split_phases(config)
    (choice,) = eval_choice.eval_choices(config, [phase])
    said = []
    tokenizer = load_tokenizer(embedded_spm_dir())
    workdir = str(records["root"] / "run-five")
    assert inputs.eval_batches(config, phase, choice, tokenizer, workdir, said.append) == []
    assert said[-1] == (
        f"no eval in phase1: preparing {corpus} set no documents aside (too few for data "
        "prepare's held-out share); set config.eval.source"
    )


def test_a_set_vocabulary_is_honoured_and_said(records):
    config = _config(records["full"], **{"model.vocab_size": 3500})
    phases = config_lib.split_phases(config)
    assert str(inputs.vocab_choice(config, phases)) == "vocab 3500 (set)"
    assert "parameters: " in config_checks.dry_run_outline(config)
    follows = _config(records["full"])
    assert (
        str(inputs.vocab_choice(follows, phases)) == f"vocab {SPM_VOCAB_SIZE} (from the tokenizer)"
    )
    # The dry run counts the parameters of the vocabulary the run will have.
    model = config_lib.bert_config(follows).replace(vocab_size=SPM_VOCAB_SIZE)
    outline = config_checks.dry_run_outline(follows)
    assert f"parameters: {config_lib.count_parameters(model):,}" in outline


def test_a_compile_check_compiles_the_vocabulary_of_the_run(records):
    from bert_jax.cli import pretrain as pretrain_command

    config = _config(records["full"])
    pretrain_command._vocab_of_the_run(config, "")
    assert config.model.vocab_size == SPM_VOCAB_SIZE  # the records' tokenizer
    base = config_lib.pretraining_config("base")  # no data named: the paper's size
    pretrain_command._vocab_of_the_run(base, "")
    assert base.model.vocab_size == config_lib.PAPER_VOCAB_SIZE
