"""Checkpoint conversion: Google TF1 and Hugging Face in, Hugging Face out, strict refusals.

Parity is checked against transformers (PyTorch) with the same numbers; the TF1 reference maps the
original variable names by hand (tests/convert_fixtures.py), not through our mapping table.
"""

from __future__ import annotations

import functools
import json
import os
import re

import jax
import numpy as np
import pytest
import torch
import transformers

from bert_jax import cli
from bert_jax.convert import hf as hf_convert
from bert_jax.convert.between_formats import HF_EXPORT_MARKER, convert
from bert_jax.convert.hf import HF_DIR_FILES
from bert_jax.convert.model_dir import ModelDirError, load_model_dir, save_model_dir
from bert_jax.convert.strict import ConversionError
from bert_jax.core import trainer
from bert_jax.core.model import BertForPreTraining
from tests.convert_fixtures import (
    google_bert_config,
    hf_state_dict_from_tf1,
    perturb_hf_model,
    random_params,
    tf1_arrays,
    write_tf1_checkpoint,
    write_vocab,
)
from tests.helpers import REAL_SENTENCES, hf_config, minilm_dir, random_batch, tiny_config


def _close(ours, ref, what: str, atol: float = 1e-5) -> float:
    ours = np.asarray(ours, dtype=np.float32)
    ref = ref.detach().numpy() if hasattr(ref, "detach") else np.asarray(ref)
    err = float(np.max(np.abs(ours - ref)))
    print(f"max abs error {what}: {err:.2e}")
    np.testing.assert_allclose(ours, ref, atol=atol, rtol=0, err_msg=what)
    return err


def _torch_inputs(batch):
    return dict(
        input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
        attention_mask=torch.tensor(batch["input_mask"], dtype=torch.long),
        token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
    )


@functools.cache
def _pretraining_forward(config):
    """bert-jax BertForPreTraining's outputs, compiled once per config (every batch here is
    3 x 24): run eagerly, a forward goes op by op, seconds of CPU time. Every position goes
    through the last layer, to compare the whole sequence output."""
    model = BertForPreTraining(config.replace(sparse_last_layer=False))
    return jax.jit(
        lambda params, inputs: model.apply({"params": params}, **inputs, deterministic=True)
    )


def _compare_pretraining(params, config, hf_model, seed: int = 0, label: str = "") -> None:
    """bert-jax BertForPreTraining vs a transformers BertForPreTraining on a padded batch."""
    batch = random_batch(np.random.default_rng(seed), 3, 24, 5, config.vocab_size)
    ours = _pretraining_forward(config)(params, trainer.model_inputs(batch))
    with torch.no_grad():
        ref = hf_model(**_torch_inputs(batch), output_hidden_states=True)
        pooled = hf_model.bert(**_torch_inputs(batch)).pooler_output
    positions = torch.tensor(batch["masked_lm_positions"], dtype=torch.long)
    ref_mlm = torch.gather(
        ref.prediction_logits, 1, positions[..., None].expand(-1, -1, config.vocab_size)
    )
    _close(ours["sequence_output"], ref.hidden_states[-1], f"{label} sequence_output")
    _close(ours["pooled_output"], pooled, f"{label} pooled_output")
    _close(ours["mlm_logits"], ref_mlm, f"{label} mlm_logits")
    _close(ours["nsp_logits"], ref.seq_relationship_logits, f"{label} nsp_logits")


def _assert_nothing_written(dst) -> None:
    dst = os.path.abspath(dst)
    assert not os.path.exists(dst), f"{dst} was written although the conversion failed"
    leftovers = [n for n in os.listdir(os.path.dirname(dst)) if n.startswith(".")]
    assert not leftovers, f"temporary files left behind: {leftovers}"


def _run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ----------------------------------------------------------------------------------------------
# Google TF1.
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tf1_setup(tmp_path_factory):
    config = tiny_config(hidden_act="gelu_new", num_hidden_layers=2)
    arrays = tf1_arrays(config, seed=3)
    directory = str(tmp_path_factory.mktemp("tf1") / "uncased_L-2_H-64_A-4")
    write_tf1_checkpoint(directory, arrays, google_bert_config(config), config.vocab_size)
    return config, arrays, directory


def test_tf1_checkpoint_converts_to_what_the_original_graph_computes(tf1_setup, tmp_path, capsys):
    config, arrays, directory = tf1_setup
    out = tmp_path / "model"
    code, stdout, _ = _run_cli(
        capsys, "convert", "--from", "tf1", directory, "--to", "bert-jax", out
    )
    assert code == 0
    assert "optimizer slot (adam_m/adam_v)" in stdout and "global_step" in stdout
    assert "MLM and NSP heads converted" in stdout

    loaded = load_model_dir(out)
    # Google's "gelu" is the tanh approximation: the model must compute that, not erf.
    assert loaded.config.hidden_act == "gelu_new"
    assert loaded.has_heads
    assert loaded.tokenizer.vocab_size == config.vocab_size and loaded.tokenizer.lowercase

    reference = transformers.BertForPreTraining(hf_config(config)).eval()
    state = {k: torch.from_numpy(np.array(v)) for k, v in hf_state_dict_from_tf1(arrays).items()}
    missing, unexpected = reference.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"bert.embeddings.position_ids"}, missing
    params = jax.tree.map(np.asarray, loaded.params)
    _compare_pretraining(params, loaded.config, reference, label="tf1")

    # The comparison can tell the two GELUs apart, so it really checks the activation.
    erf_reference = transformers.BertForPreTraining(hf_config(config.replace(hidden_act="gelu")))
    erf_reference.load_state_dict(state, strict=False)
    batch = random_batch(np.random.default_rng(0), 3, 24, 5, config.vocab_size)
    # The encoder's output, from the forward compiled above (BertModel of params["bert"]).
    ours = _pretraining_forward(loaded.config)(params, trainer.model_inputs(batch))
    with torch.no_grad():
        erf = erf_reference.eval().bert(**_torch_inputs(batch)).last_hidden_state.numpy()
    assert np.max(np.abs(np.asarray(ours["sequence_output"]) - erf)) > 1e-4

    # Straight to Hugging Face: a strict load that computes the same (with "gelu_new").
    convert("tf1", directory, "hf", tmp_path / "hf")
    assert "vocab.txt" in os.listdir(tmp_path / "hf")  # WordPiece: its files are listed ones too
    assert set(os.listdir(tmp_path / "hf")) <= {*HF_DIR_FILES, HF_EXPORT_MARKER}
    exported, info = transformers.BertForPreTraining.from_pretrained(
        tmp_path / "hf", output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), info
    assert exported.config.hidden_act == "gelu_new"
    _compare_pretraining(params, loaded.config, exported.eval(), label="tf1->hf")


def _rewrite_tf1(tf1_setup, tmp_path, *, drop=None, reshape=None, vocab_size=None, vocab_txt=None):
    config, arrays, _ = tf1_setup
    arrays = dict(arrays)
    if drop:
        del arrays[drop]
    if reshape:
        arrays[reshape] = arrays[reshape][:, :-1]
    bert_config = google_bert_config(config)
    if vocab_size:
        bert_config["vocab_size"] = vocab_size
    directory = str(tmp_path / "bad_ckpt")
    write_tf1_checkpoint(
        directory, arrays, bert_config, vocab_txt or config.vocab_size, optimizer_slots=False
    )
    return directory


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", "missing tensor 'bert/encoder/layer_1/output/LayerNorm/gamma'"),
        ("shape", "tensor 'bert/encoder/layer_0/intermediate/dense/kernel' has shape (64, 127)"),
        ("vocab", "tensor 'bert/embeddings/word_embeddings' has shape (512, 64)"),
        ("vocab_txt", "has 600 entries but the model's vocab_size is 512"),
        ("truncated", "cannot be read"),
    ],
)
def test_tf1_mismatched_or_truncated_checkpoints_are_refused(
    tf1_setup, tmp_path, capsys, case, expected
):
    if case == "missing":
        directory = _rewrite_tf1(
            tf1_setup, tmp_path, drop="bert/encoder/layer_1/output/LayerNorm/gamma"
        )
    elif case == "shape":
        directory = _rewrite_tf1(
            tf1_setup, tmp_path, reshape="bert/encoder/layer_0/intermediate/dense/kernel"
        )
    elif case == "vocab":  # bert_config.json says 520 words, the checkpoint holds 512
        directory = _rewrite_tf1(tf1_setup, tmp_path, vocab_size=520)
    elif case == "vocab_txt":  # vocab.txt has more entries than the embedding table
        directory = _rewrite_tf1(tf1_setup, tmp_path, vocab_txt=600)
    else:  # a data file cut short (an interrupted download)
        directory = _rewrite_tf1(tf1_setup, tmp_path)
        data = os.path.join(directory, "bert_model.ckpt.data-00000-of-00001")
        with open(data, "r+b") as f:
            f.truncate(os.path.getsize(data) // 2)
    out = tmp_path / "out"
    code, _, stderr = _run_cli(capsys, "convert", "--from", "tf1", directory, "--to", "hf", out)
    assert code == 2
    assert expected in stderr
    _assert_nothing_written(out)


# ----------------------------------------------------------------------------------------------
# Hugging Face in.
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_setup(tmp_path_factory):
    config = tiny_config(num_hidden_layers=2)
    torch.manual_seed(0)
    model = transformers.BertForPreTraining(hf_config(config)).eval()
    perturb_hf_model(model)
    directory = tmp_path_factory.mktemp("hf") / "safetensors"
    model.save_pretrained(directory)
    write_vocab(str(directory / "vocab.txt"), config.vocab_size)
    with open(directory / "tokenizer_config.json", "w") as f:
        json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}, f)
    return config, model, directory


def test_hf_safetensors_converts_with_parity(hf_setup, tmp_path, capsys):
    config, model, directory = hf_setup
    assert os.path.exists(directory / "model.safetensors")
    out = tmp_path / "model"
    code, stdout, _ = _run_cli(
        capsys, "convert", "--from", "hf", directory, "--to", "bert-jax", out
    )
    assert code == 0, stdout
    assert "MLM and NSP heads converted" in stdout
    loaded = load_model_dir(out, load_tokenizer=True)
    assert loaded.config.hidden_act == "gelu" and loaded.has_heads
    assert loaded.tokenizer.lowercase
    _compare_pretraining(jax.tree.map(np.asarray, loaded.params), config, model, label="hf")


def test_vocab_padding_on_import_keeps_parity_and_is_dropped_on_export(hf_setup, tmp_path, capsys):
    config, model, directory = hf_setup
    out = tmp_path / "padded"
    argv = ["convert", "--from", "hf", directory, "--to", "bert-jax", out]
    code, stdout, _ = _run_cli(capsys, *argv, "--vocab-pad-multiple", 384)
    assert code == 0, stdout
    loaded = load_model_dir(out)
    assert loaded.config.vocab_pad_multiple == 384 and loaded.config.padded_vocab_size == 768
    table = np.asarray(loaded.params["bert"]["embeddings"]["word_embeddings"]["embedding"])
    assert table.shape == (768, config.hidden_size) and not np.any(table[config.vocab_size :])
    params = jax.tree.map(np.asarray, loaded.params)
    _compare_pretraining(params, loaded.config, model, seed=4, label="padded")

    counted = re.search(r"([\d,]+) parameters \(vocabulary padding rows not counted\)", stdout)
    back = tmp_path / "hf"
    code, stdout, _ = _run_cli(capsys, "convert", "--from", "bert-jax", out, "--to", "hf", back)
    assert code == 0, stdout
    assert counted and f"{counted.group(1)} parameters" in stdout  # the same count both ways
    assert int(counted.group(1).replace(",", "")) == sum(p.numel() for p in model.parameters())
    exported = hf_convert.read_hf_dir(back)
    assert exported.config["vocab_size"] == config.vocab_size
    assert exported.shapes["bert.embeddings.word_embeddings.weight"][0] == config.vocab_size
    for key, value in model.state_dict().items():
        if key in exported.shapes:
            np.testing.assert_array_equal(exported.read(key), value.numpy(), err_msg=key)

    code, _, stderr = _run_cli(capsys, *argv[:-1], tmp_path / "bad", "--vocab-pad-multiple", 0)
    assert code != 0 and re.search("vocab_pad_multiple[ =]0", stderr), stderr
    _assert_nothing_written(tmp_path / "bad")
    code, _, stderr = _run_cli(
        capsys,
        "convert",
        "--from",
        "bert-jax",
        out,
        "--to",
        "hf",
        tmp_path / "hf2",
        "--vocab-pad-multiple",
        128,
    )
    assert code != 0 and "applies to --to bert-jax only" in stderr


def test_hf_directory_with_only_tokenizer_json_converts_with_its_tokenizer(
    hf_setup, tmp_path, capsys
):
    """transformers 5 saves a BERT tokenizer as tokenizer.json alone (no vocab.txt): the converted
    model directory must still carry the tokenizer, equal to the vocab.txt one, and encode."""
    from bert_jax.data.tokenizers.load_or_train import load_tokenizer

    _, _, directory = hf_setup
    source = tmp_path / "hf5"
    source.mkdir()
    for name in ("config.json", "model.safetensors"):
        (source / name).write_bytes((directory / name).read_bytes())
    lines = (directory / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab = {token: index for index, token in enumerate(lines)}
    transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True).save_pretrained(source)
    assert "tokenizer.json" in os.listdir(source) and "vocab.txt" not in os.listdir(source)
    out = tmp_path / "model"
    code, stdout, _ = _run_cli(capsys, "convert", "--from", "hf", source, "--to", "bert-jax", out)
    assert code == 0 and "wordpiece" in stdout, stdout
    tokenizer = load_model_dir(out, load_tokenizer=True).tokenizer
    reference = load_tokenizer(directory / "vocab.txt")
    assert tokenizer.lowercase and tokenizer.vocab == reference.vocab
    for sentence in REAL_SENTENCES:
        assert tokenizer.encode(sentence) == reference.encode(sentence)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(REAL_SENTENCES[:2]) + "\n", encoding="utf-8")
    features = tmp_path / "features.npy"
    argv = ["encode", "--model", out, "--input", texts, "--output", features]
    assert _run_cli(capsys, *argv)[0] == 0
    assert np.load(features).shape[0] == 2


def test_hf_pytorch_bin_is_read_with_weights_only(hf_setup, tmp_path):
    config, model, _ = hf_setup
    directory = tmp_path / "bin"
    directory.mkdir()
    # The legacy format: the full state dict, tied decoder copies included.
    torch.save(model.state_dict(), directory / "pytorch_model.bin")
    model.config.to_json_file(str(directory / "config.json"))
    report = convert("hf", directory, "bert-jax", tmp_path / "model")
    assert "cls.predictions.decoder.weight" in report.ignored
    params = jax.tree.map(np.asarray, load_model_dir(tmp_path / "model").params)
    _compare_pretraining(params, config, model, seed=1, label="pytorch_model.bin")


def test_bfloat16_safetensors_are_read(hf_setup, tmp_path):
    from safetensors.torch import save_file

    _, model, _ = hf_setup
    directory = tmp_path / "bf16"
    directory.mkdir()
    state = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items() if "decoder" not in k}
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    model.config.to_json_file(str(directory / "config.json"))
    convert("hf", directory, "bert-jax", tmp_path / "model")
    params = load_model_dir(tmp_path / "model").params
    np.testing.assert_array_equal(
        np.asarray(params["bert"]["pooler"]["kernel"]),
        state["bert.pooler.dense.weight"].float().numpy().T,
    )


class _NotATensor:
    pass


def test_pytorch_bin_with_pickled_objects_is_refused(hf_setup, tmp_path):
    _, model, _ = hf_setup
    directory = tmp_path / "evil"
    directory.mkdir()
    torch.save(
        {"bert.embeddings.word_embeddings.weight": _NotATensor()}, directory / "pytorch_model.bin"
    )
    model.config.to_json_file(str(directory / "config.json"))
    with pytest.raises(ConversionError, match="weights_only"):
        convert("hf", directory, "bert-jax", tmp_path / "out")
    _assert_nothing_written(tmp_path / "out")


def _write_hf(directory, state, hf_config_dict):
    directory.mkdir()
    hf_convert.write_safetensors(directory / "model.safetensors", state, {"format": "pt"})
    with open(directory / "config.json", "w") as f:
        json.dump(hf_config_dict, f)
    return directory


@pytest.mark.parametrize("case", ["missing", "shape", "vocab", "extra", "untied"])
def test_hf_mismatched_checkpoints_are_refused(hf_setup, tmp_path, capsys, case):
    _, model, _ = hf_setup
    state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    config_dict = model.config.to_dict()
    if case == "missing":
        del state["bert.encoder.layer.1.attention.self.value.bias"]
        expected = "missing tensor 'bert.encoder.layer.1.attention.self.value.bias'"
    elif case == "shape":
        state["bert.pooler.dense.weight"] = state["bert.pooler.dense.weight"][:32]
        expected = "tensor 'bert.pooler.dense.weight' has shape (32, 64)"
    elif case == "vocab":
        config_dict["vocab_size"] = 500
        expected = "tensor 'bert.embeddings.word_embeddings.weight' has shape (512, 64)"
    elif case == "extra":
        state["bert.encoder.layer.2.output.dense.bias"] = np.zeros(64, np.float32)
        expected = "'bert.encoder.layer.2.output.dense.bias'"
    else:
        state["cls.predictions.decoder.weight"] = state["cls.predictions.decoder.weight"] + 1
        expected = "tensor 'cls.predictions.decoder.weight' differs"
    directory = _write_hf(tmp_path / "bad", state, config_dict)
    out = tmp_path / "out"
    code, _, stderr = _run_cli(
        capsys, "convert", "--from", "hf", directory, "--to", "bert-jax", out
    )
    assert code == 2
    assert expected in stderr, stderr
    _assert_nothing_written(out)


def test_drop_heads_converts_the_encoder_alone(hf_setup, tmp_path):
    _, _, directory = hf_setup
    report = convert("hf", directory, "bert-jax", tmp_path / "enc", drop_heads=True)
    assert not report.has_heads
    assert report.ignored["cls.seq_relationship.weight"].startswith("head dropped")
    loaded = load_model_dir(tmp_path / "enc")
    assert sorted(loaded.params) == ["bert"] and not loaded.has_heads


def test_fine_tuned_task_heads_need_drop_heads(hf_setup, tmp_path):
    _, model, _ = hf_setup
    # A BertForSequenceClassification-style checkpoint: encoder + classifier, no cls.*.
    state = {k: v.numpy() for k, v in model.state_dict().items() if k.startswith("bert.")}
    state["classifier.weight"] = np.zeros((3, 64), np.float32)
    state["classifier.bias"] = np.zeros(3, np.float32)
    directory = _write_hf(tmp_path / "clf", state, model.config.to_dict())
    with pytest.raises(ConversionError, match=r"'classifier.bias'.*\n.*--drop-heads"):
        convert("hf", directory, "bert-jax", tmp_path / "out")
    _assert_nothing_written(tmp_path / "out")
    report = convert("hf", directory, "bert-jax", tmp_path / "out", drop_heads=True)
    assert sorted(n for n in report.ignored if n.startswith("classifier")) == [
        "classifier.bias",
        "classifier.weight",
    ]


# ----------------------------------------------------------------------------------------------
# The real all-MiniLM-L6-v2 encoder, in and out.
# ----------------------------------------------------------------------------------------------


def test_minilm_encoder_only_round_trips_through_hugging_face(tmp_path, capsys):
    source = minilm_dir()
    model_path, hf_path = tmp_path / "minilm", tmp_path / "minilm_hf"
    code, stdout, _ = _run_cli(
        capsys, "convert", "--from", "hf", source, "--to", "bert-jax", model_path
    )
    assert code == 0
    assert "encoder only (no MLM/NSP pretraining heads" in stdout
    assert "encoder-only checkpoint" in stdout
    code, stdout, _ = _run_cli(
        capsys, "convert", "--from", "bert-jax", model_path, "--to", "hf", hf_path
    )
    assert code == 0

    exported, info = transformers.BertModel.from_pretrained(
        hf_path, output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    original = transformers.BertModel.from_pretrained(source, attn_implementation="eager").eval()
    tokenizer = transformers.BertTokenizer.from_pretrained(hf_path)
    reference_tokenizer = transformers.BertTokenizer(f"{source}/vocab.txt", do_lower_case=True)
    encoded = tokenizer(REAL_SENTENCES, padding=True, return_tensors="pt")
    assert (
        encoded["input_ids"].tolist()
        == reference_tokenizer(REAL_SENTENCES, padding=True, return_tensors="pt")[
            "input_ids"
        ].tolist()
    )
    with torch.no_grad():
        ours = exported.eval()(**encoded)
        ref = original(**encoded)
    _close(ours.last_hidden_state, ref.last_hidden_state, "MiniLM hf->bert-jax->hf sequence")
    _close(ours.pooler_output, ref.pooler_output, "MiniLM hf->bert-jax->hf pooled")


# ----------------------------------------------------------------------------------------------
# bert-jax out to Hugging Face.
# ----------------------------------------------------------------------------------------------


def test_bert_jax_to_hf_loads_strictly_and_reproduces_outputs(tmp_path, capsys):
    config = tiny_config(num_hidden_layers=2)
    params = random_params(config)
    vocab = write_vocab(str(tmp_path / "vocab.txt"), config.vocab_size)
    model_path = save_model_dir(tmp_path / "model", config, params, tokenizer=vocab)
    out = tmp_path / "hf"
    # Through the command in this process (tests/test_cli.py runs the installed console script).
    code, stdout, stderr = _run_cli(
        capsys, "convert", "--from", "bert-jax", model_path, "--to", "hf", out
    )
    assert code == 0, stderr
    assert "config.json, model.safetensors" in stdout
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= set(
        os.listdir(out)
    )
    with open(out / "tokenizer_config.json") as f:
        assert json.load(f)["do_lower_case"] is True

    model, info = transformers.BertForPreTraining.from_pretrained(
        out, output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), info  # no missing, unexpected or mismatched keys
    _compare_pretraining(params, config, model.eval(), seed=2, label="bert-jax->hf")


def test_an_unexported_pretraining_workdir_converts_from_its_latest_checkpoint(tmp_path, capsys):
    """`--from bert-jax WORKDIR` of a run that has not exported model/ yet reads its latest
    checkpoint: the command hands the conversion training's loader (convert/ stands below
    training/). `convert()` with the format's own loader refuses such a workdir in one line."""
    from bert_jax.training import checkpointing, config_lib

    run_config = config_lib.pretraining_config("tiny")
    run_config.model.update(
        vocab_size=300,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        num_hidden_layers=1,
        max_position_embeddings=64,
    )
    config = config_lib.bert_config(run_config)  # the run's 384 embedding rows (pad multiple 128)
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(run_config.to_json_best_effort(), encoding="utf-8")
    checkpoints = checkpointing.Checkpointer(str(workdir / "checkpoints"), async_save=False)
    for step in (4, 8):
        state = {"params": random_params(config, seed=step), "step": np.int32(step)}
        checkpoints.save(step, state, np.zeros((1, 4), np.int32))
    checkpoints.wait()
    checkpoints.close()

    with pytest.raises(ModelDirError, match="pretraining workdir with no exported"):
        convert("bert-jax", workdir, "hf", tmp_path / "refused")
    assert not (tmp_path / "refused").exists()

    out = tmp_path / "model"
    code, stdout, _ = _run_cli(
        capsys, "convert", "--from", "bert-jax", workdir, "--to", "bert-jax", out
    )
    assert code == 0 and f"converted bert-jax {workdir} -> bert-jax {out}" in stdout
    converted = load_model_dir(out)
    assert converted.config == config and converted.has_heads
    expected = random_params(config, seed=8)
    assert jax.tree.structure(converted.params) == jax.tree.structure(expected)
    for ours, theirs in zip(jax.tree.leaves(converted.params), jax.tree.leaves(expected)):
        np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_sentencepiece_tokenizer_is_exported_for_transformers(tmp_path):
    from bert_jax.data.sources import embedded as sources
    from bert_jax.data.tokenizers.load_or_train import load_tokenizer
    from bert_jax.data.tokenizers.sentencepiece import train_sentencepiece

    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(s for d in sources.embedded_documents("train")[:20] for s in d))
    spm = train_sentencepiece(
        [str(text)], 200, str(tmp_path / "spm"), lowercase=True, num_threads=1
    )
    config = tiny_config(num_hidden_layers=1)
    params = random_params(config)
    save_model_dir(tmp_path / "model", config, {"bert": params["bert"]}, tokenizer=spm)
    convert("bert-jax", tmp_path / "model", "hf", tmp_path / "hf")
    # What an export holds is what `--overwrite` may replace: every file is a listed one.
    assert set(os.listdir(tmp_path / "hf")) <= {*HF_DIR_FILES, HF_EXPORT_MARKER}
    assert {
        "spiece.model",
        "tokenizer.json",
        "tokenizer_config.json",
        "bert_jax_tokenizer.json",
    } <= set(os.listdir(tmp_path / "hf"))
    reloaded = load_tokenizer(tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for sentence in REAL_SENTENCES[:3]:
        ids = [spm.cls_id, *spm.encode(sentence), spm.sep_id]
        assert [spm.cls_id, *reloaded.encode(sentence), spm.sep_id] == ids
        assert theirs(sentence)["input_ids"] == ids


def test_safetensors_io_matches_the_safetensors_library(tmp_path):
    from safetensors.numpy import load_file
    from safetensors.torch import save_file

    tensors = {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.arange(5, dtype=np.int64),
        "c": np.ones((2, 3, 1), np.float16),
    }
    hf_convert.write_safetensors(tmp_path / "ours.safetensors", tensors, {"format": "pt"})
    theirs = load_file(tmp_path / "ours.safetensors")
    for name, value in tensors.items():
        np.testing.assert_array_equal(theirs[name], value)
    bf16 = torch.randn(4, 3).to(torch.bfloat16)
    save_file({"w": bf16}, tmp_path / "theirs.safetensors", metadata={"format": "pt"})
    read = hf_convert.read_safetensors(tmp_path / "theirs.safetensors")
    assert read.shapes == {"w": (4, 3)} and read.metadata == {"format": "pt"}
    np.testing.assert_array_equal(hf_convert.to_numpy(read.read("w")), bf16.float().numpy())
