"""Each pretraining objective from the command line at tiny scale: `data prepare --objective`,
`pretrain --config.objective`, `eval`, and `convert --to hf` into the matching transformers class;
records of one objective refused by a config of another in one line (issue 38)."""

from __future__ import annotations

import json
import os

import pytest
import transformers

from bert_jax import cli
from tests.data_fixtures import embedded_spm_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "configs", "bert.py:tiny")
HF_CLASS = {"mlm+nsp": "BertForPreTraining", "mlm": "BertForMaskedLM", "ltr": "BertLMHeadModel"}
# One layer of 64, six steps at length 32 on the embedded eval split: seconds per objective.
OVERRIDES = [
    "--config.model.vocab_size=3000",
    "--config.model.num_hidden_layers=1",
    "--config.model.hidden_size=64",
    "--config.model.num_attention_heads=2",
    "--config.model.intermediate_size=128",
    "--config.model.max_position_embeddings=64",
    "--config.total_steps=6",
    "--config.phase1.fraction=1.0",
    "--config.phase2.fraction=0.0",
    "--config.phase1.max_seq_length=32",
    "--config.phase1.max_predictions_per_seq=5",
    "--config.phase1.batch_size=8",
    "--config.eval.every_steps=6",
    "--config.eval.batches=2",
    "--config.eval.batch_size=8",
    "--config.checkpoint.every_steps=6",
    "--config.log_every_steps=3",
    "--config.optimizer.warmup_steps=2",
    "--config.optimizer.learning_rate=1e-3",
    "--config.data.shuffle_buffer_size=64",
]


def _prepare(tmp, objective: str) -> str:
    records = os.path.join(tmp, f"records-{objective}")
    if not os.path.isdir(records):
        argv = ["data", "prepare", "--input", "embedded:eval", "--tokenizer", embedded_spm_dir()]
        argv += ["--output", records, "--max-seq-length", "32", "--max-predictions-per-seq", "5"]
        assert cli.main([*argv, "--dupe-factor", "1", "--objective", objective]) == 0
    return records


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny pretraining run per objective: {objective: (records, workdir, console output)}."""
    tmp = str(tmp_path_factory.mktemp("objectives"))
    out = {}
    for objective in HF_CLASS:
        records = _prepare(tmp, objective)
        workdir = os.path.join(tmp, f"run-{objective}")
        argv = ["pretrain", "--config", TINY, "--workdir", workdir, *OVERRIDES]
        argv += [f"--config.objective={objective}", f"--config.data.source={records}"]
        argv += [f"--config.eval.source={records}"]
        out[objective] = (records, workdir, argv)
    return out


@pytest.mark.parametrize("objective", list(HF_CLASS))
def test_each_objective_pretrains_evaluates_and_exports_to_its_class(runs, objective, capsys):
    records, workdir, argv = runs[objective]
    assert cli.main(argv) == 0
    console = capsys.readouterr().out
    final = [line for line in console.splitlines() if line.startswith("final eval")]
    assert final and "MLM perplexity" in final[0]
    assert ("NSP accuracy" in final[0]) == (objective == "mlm+nsp")
    with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    train_rows = [row for row in rows if row.get("kind", "train") == "train" and "loss" in row]
    assert train_rows and all(("nsp_loss" in row) == (objective == "mlm+nsp") for row in train_rows)
    with capsys.disabled():  # the tiny run's result, shown with pytest -s
        print(f"\n{objective}: last train loss {train_rows[-1]['loss']:.4f}; {final[0]}")

    assert cli.main(["eval", "--model", workdir, "--data", records, "--batch-size", "8"]) == 0
    printed = capsys.readouterr().out
    assert f"objective: {objective}" in printed and "mlm_perplexity: " in printed
    assert ("nsp_accuracy" in printed) == (objective == "mlm+nsp")

    exported = os.path.join(os.path.dirname(workdir), f"hf-{objective}")
    model = os.path.join(workdir, "model")
    assert cli.main(["convert", "--from", "bert-jax", model, "--to", "hf", exported]) == 0
    hf_config = transformers.AutoConfig.from_pretrained(exported)
    assert hf_config.architectures == [HF_CLASS[objective]]
    assert hf_config.is_decoder == (objective == "ltr")
    hf_class = getattr(transformers, HF_CLASS[objective])
    _, info = hf_class.from_pretrained(exported, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    # And back: the model directory made from it records the objective.
    back = os.path.join(os.path.dirname(workdir), f"back-{objective}")
    assert cli.main(["convert", "--from", "hf", exported, "--to", "bert-jax", back]) == 0
    with open(os.path.join(back, "config.json"), encoding="utf-8") as f:
        assert json.load(f)["objective"] == objective
    capsys.readouterr()


def test_records_of_another_objective_are_refused_in_one_line(runs, capsys):
    records, _, _ = runs["ltr"]
    _, workdir, argv = runs["mlm"]
    argv = [a for a in argv if not a.startswith(("--config.data.source", "--workdir"))]
    argv += [f"--config.data.source={records}", "--workdir", workdir + "-refused"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "prepared for objective 'ltr' but config.objective is 'mlm'" in err
    assert not os.path.exists(workdir + "-refused")  # refused before the workdir was made


# docs/ablations.md's command lines are parsed with every page's by tests/test_readme.py.


def test_init_from_and_resume_from_another_objective_are_refused_in_one_line(
    runs, tmp_path, capsys
):
    from bert_jax.convert import model_dir
    from bert_jax.core.model import BertConfig

    model = tmp_path / "mlm-model"  # what is checked first: the config.json of each
    model.mkdir()
    values = model_dir.config_dict(BertConfig(objective="mlm"), True, None, {})
    (model / "config.json").write_text(json.dumps(values))
    run = tmp_path / "mlm-run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"objective": "mlm"}))
    _, workdir, argv = runs["ltr"]
    argv = [a for a in argv if not a.startswith("--workdir")] + ["--workdir", str(tmp_path / "w")]
    for setting, path in (("init_from", model), ("resume_from", run)):
        assert cli.main([*argv, f"--config.{setting}={path}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"config.{setting}={path} was pretrained for objective 'mlm' but " in err
        assert "config.objective is 'ltr'" in err
    assert not (tmp_path / "w").exists()
