"""The checkpoint curve (Figure 5): a task fine-tuned from each of three retained checkpoints of
a tiny pretraining workdir through `bert-jax finetune --each-checkpoint`, resumed step by step."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bert_jax import cli
from bert_jax.training import checkpointing, config_lib, load_model
from tests.glue_fixtures.tiny import GLUE_DIR, fixture_tokenizer, tiny_encoder

STEPS = (4, 8, 12)
FLAGS = ["--epochs", "1", "--batch-size", "8", "--eval-batch-size", "8", "--max-seq-length", "32"]


@pytest.fixture(scope="module")
def pretraining_workdir(tmp_path_factory):
    """config.json, tokenizer/ and three checkpoints (different random encoders), as a
    pretraining run leaves them before it exports model/."""
    root = tmp_path_factory.mktemp("pretrain") / "run"
    config = config_lib.pretraining_config("tiny")
    config.model.update(
        vocab_size=512,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        sparse_last_layer=False,
    )
    root.mkdir()
    (root / "config.json").write_text(config.to_json_best_effort(), encoding="utf-8")
    fixture_tokenizer().save(str(root / "tokenizer"))
    checkpoints = checkpointing.Checkpointer(str(root / "checkpoints"), async_save=False)
    for seed, step in enumerate(STEPS):
        _, params = tiny_encoder(seed)
        state = {"params": params, "step": np.int32(step)}
        checkpoints.save(step, state, np.zeros((1, 4), np.int32))
    checkpoints.wait()
    checkpoints.close()
    return root


def test_a_chosen_checkpoint_loads_its_own_params(pretraining_workdir):
    for seed, step in enumerate(STEPS):
        loaded = load_model.load_workdir_checkpoint(pretraining_workdir, step=step)
        want = tiny_encoder(seed)[1]["bert"]["pooler"]["kernel"]
        np.testing.assert_array_equal(loaded.params["bert"]["pooler"]["kernel"], want)
    assert load_model.load_workdir_checkpoint(pretraining_workdir).info["step"] == 12
    with pytest.raises(load_model.ModelDirError, match=r"no checkpoint of step 5 \(it has \[4, 8"):
        load_model.load_workdir_checkpoint(pretraining_workdir, step=5)


def test_each_checkpoint_curve_runs_resumes_and_plots(pretraining_workdir, tmp_path, capsys):
    workdir = tmp_path / "curve"
    argv = ["finetune", "--task", "glue/SST-2", "--model", str(pretraining_workdir)]
    argv += ["--data", GLUE_DIR, "--workdir", str(workdir), "--each-checkpoint", *FLAGS]
    assert cli.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    curve = json.loads((workdir / "curve.json").read_text())
    assert [p["step"] for p in curve["points"]] == list(STEPS)
    assert curve["metric"] == "dev accuracy" and "glue/SST-2 dev accuracy by step: 4:" in out
    for step in STEPS:
        record = json.loads((workdir / "steps" / f"step={step}" / "result.json").read_text())
        assert record["model"] == f"{pretraining_workdir}@step={step}"
        assert (workdir / "steps" / f"step={step}" / "SST-2.tsv").exists()
    assert (workdir / "plots" / "curve.png").stat().st_size > 1000
    assert "| 8 |" in (workdir / "curve.md").read_text()

    # Resume: lose step 8's result; only that step runs again.
    kept = {s: (workdir / "steps" / f"step={s}" / "result.json").read_text() for s in (4, 12)}
    (workdir / "steps" / "step=8" / "result.json").unlink()
    assert cli.main(argv) == 0
    capsys.readouterr()
    for step, text in kept.items():
        assert (workdir / "steps" / f"step={step}" / "result.json").read_text() == text
    again = json.loads((workdir / "curve.json").read_text())
    assert [p["step"] for p in again["points"]] == list(STEPS)
    assert (workdir / "steps" / "step=8" / "result.json").exists()

    # A step the run does not keep, and another task into the same curve, are one-line errors.
    assert cli.main([*argv, "--steps", "5"]) == 2
    assert "keeps checkpoints of steps [4, 8, 12]; not of [5]" in capsys.readouterr().err
    other = [a if a != "glue/SST-2" else "glue/RTE" for a in argv]
    assert cli.main(other) == 2
    assert "is a curve of glue/SST-2" in capsys.readouterr().err
    print("SST-2 fixture curve:", [(p["step"], round(p["score"], 1)) for p in curve["points"]])
