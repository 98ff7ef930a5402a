"""`bert-jax eval` on prepared records (issue 49): every record counted once, progress and the
count said, and records the model cannot read refused in one line: another tokenizer than the
model's (as `pretrain` refuses them), or token ids beyond its vocabulary."""

from __future__ import annotations

import pytest

from bert_jax import cli
from bert_jax.convert import model_dir
from bert_jax.data.records import tfrecord as records_lib
from bert_jax.runtime.errors import UserError
from bert_jax.training import config_lib, model_eval, pretrain
from tests.convert_fixtures import random_params, write_vocab
from tests.data_fixtures import SPM_VOCAB_SIZE, embedded_spm, embedded_spm_dir
from tests.helpers import tiny_config

CONFIG = tiny_config(vocab_size=SPM_VOCAB_SIZE, num_hidden_layers=1, hidden_size=32)
# The batch size of the tests that evaluate in several batches: one shape, so one eval program
# compiled (then read from JAX's compilation cache), and few steps over the ~480 records.
EVAL_BATCH = 64


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Records of the embedded eval split (length 32) and a model of their tokenizer."""
    root = tmp_path_factory.mktemp("eval_records")
    records = str(root / "records")
    argv = ["data", "prepare", "--input", "embedded:eval", "--tokenizer", embedded_spm_dir()]
    argv += ["--output", records, "--max-seq-length", "32", "--max-predictions-per-seq", "5"]
    assert cli.main([*argv, "--dupe-factor", "1"]) == 0
    model = model_dir.save_model_dir(root / "model", CONFIG, random_params(CONFIG), embedded_spm())
    tf = records_lib.import_tensorflow()
    count = sum(1 for _ in tf.data.TFRecordDataset(records_lib.list_record_files([records])))
    return {"root": root, "records": records, "model": str(model), "count": count}


def test_every_record_counts_once_whatever_the_batch_size(dirs):
    count = dirs["count"]
    lines = []
    whole = model_eval.evaluate_model(dirs["model"], dirs["records"], batch_size=count)
    # A last batch that is partly filling, at the size the command's test uses (one program).
    batch = EVAL_BATCH if count % EVAL_BATCH else EVAL_BATCH - 1
    assert count % batch
    padded = model_eval.evaluate_model(
        dirs["model"], dirs["records"], batch_size=batch, console=lines.append
    )
    assert whole["examples"] == padded["examples"] == count
    assert padded["batches"] == -(-count // batch)
    for key in ("mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "mlm_baseline_accuracy"):
        assert padded[key] == pytest.approx(whole[key], abs=1e-5), key
    assert lines[:2] == [f"loading {dirs['model']}", f"evaluating {count} records"]
    assert lines[-1].startswith(f"evaluated {count} records in {padded['batches']} batches in ")
    # --batches stops early, and says how many records that was.
    first = model_eval.evaluate_model(dirs["model"], dirs["records"], batch_size=batch, batches=2)
    assert (first["examples"], first["batches"]) == (2 * batch, 2)


def test_eval_prints_how_many_records_it_read(dirs, capsys):
    argv = ["eval", "--model", dirs["model"], "--data", dirs["records"]]
    assert cli.main([*argv, "--batch-size", str(EVAL_BATCH)]) == 0
    out = capsys.readouterr().out
    assert f"evaluating {dirs['count']} records" in out
    assert f"examples: {dirs['count']} records ({-(-dirs['count'] // EVAL_BATCH)} batches)" in out


def test_records_of_another_tokenizer_are_refused_naming_both(dirs, capsys):
    vocab = write_vocab(str(dirs["root"] / "vocab.txt"), SPM_VOCAB_SIZE)
    other = model_dir.save_model_dir(
        dirs["root"] / "wordpiece-model", CONFIG, random_params(CONFIG), vocab
    )
    assert cli.main(["eval", "--model", str(other), "--data", dirs["records"]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"--data {dirs['records']} was prepared with another tokenizer (sentencepiece, " in err
    assert f"than --model {other}'s tokenizer (wordpiece, {SPM_VOCAB_SIZE} pieces" in err

    # pretrain names the same two tokenizers before anything compiles.
    config = config_lib.pretraining_config("tiny")
    config.model.vocab_size = SPM_VOCAB_SIZE
    config.total_steps = 2
    config.data.source = dirs["records"]
    config.data.tokenizer = vocab
    with pytest.raises(UserError, match="was prepared with another tokenizer .sentencepiece"):
        pretrain.pretrain(config, str(dirs["root"] / "run"))


def test_a_corpus_given_as_data_is_one_line_saying_how_to_prepare_it(dirs, capsys):
    for corpus in ("embedded:eval", "tfds:wikipedia/20230601.en:train"):
        assert cli.main(["eval", "--model", dirs["model"], "--data", corpus]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"--data {corpus} is a corpus, not prepared records" in err
        assert f"bert-jax data prepare --input {corpus} --tokenizer MODEL/tokenizer" in err


def test_token_ids_beyond_the_models_vocabulary_are_one_line(dirs, capsys):
    small = tiny_config(vocab_size=1000, num_hidden_layers=1, hidden_size=32)
    # No tokenizer saved with it: only the ids can tell.
    model = model_dir.save_model_dir(dirs["root"] / "small-model", small, random_params(small))
    assert cli.main(["eval", "--model", str(model), "--data", dirs["records"]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"--data {dirs['records']} holds token id " in err
    assert f"but --model {model} has vocab_size 1000" in err
    assert "Traceback" not in err


def test_with_json_the_progress_goes_to_stderr(dirs, capsys):
    import json

    argv = ["eval", "--model", dirs["model"], "--data", dirs["records"], "--json"]
    assert cli.main([*argv, "--batch-size", str(EVAL_BATCH), "--batches", "1"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["examples"] == EVAL_BATCH
    assert f"evaluating {EVAL_BATCH} records" in captured.err


def test_batch_settings_out_of_range_are_one_line_before_anything_is_read(tmp_path, capsys):
    """The declared ranges, checked from the command line and from Python alike."""
    base = ["eval", "--model", str(tmp_path / "absent"), "--data", str(tmp_path / "absent")]
    for flag, value, message in [
        ("--batch-size", "0", "--batch-size 0 must be >= 1"),
        ("--batches", "-1", "--batches -1 must be >= 0"),
    ]:
        assert cli.main([*base, flag, value]) == 2
        assert capsys.readouterr().err == f"bert-jax eval: error: {message}\n"
    with pytest.raises(UserError, match="^--batch-size 0 must be >= 1$"):
        model_eval.evaluate_model(tmp_path / "absent", tmp_path / "absent", batch_size=0)
