"""`bert-jax fill-mask` and `fill_mask()`: the same token ids, order and probabilities as
transformers' `pipeline("fill-mask")` on the model `bert-jax convert --to hf` exports, for a
WordPiece model (real all-MiniLM-L6-v2 weights and vocabulary under a random masked-LM head) and a
SentencePiece one (a tokenizer trained here); the command's output, and bad input refused in one
line, on a small random model of MiniLM's vocabulary."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import transformers

from bert_jax import cli
from bert_jax.convert.between_formats import convert
from bert_jax.convert.model_dir import load_model_dir, save_model_dir
from bert_jax.data.sources import embedded as corpus
from bert_jax.data.tokenizers.sentencepiece import train_sentencepiece
from bert_jax.inference.fill_mask import fill_mask
from tests.convert_fixtures import random_params
from tests.helpers import minilm_dir, tiny_config

TOP_K = 5
TEXTS = [
    "The capital of France is [MASK].",
    "[MASK] people went to the market to buy [MASK] and bread.",
    "She opened the [MASK]",
    "the  [MASK]   of the story [SEP] was [MASK] [MASK] indeed",
]


def _with_random_head(encoder_dir, out, seed=0):
    """The encoder's real weights under a freshly initialised MLM/NSP head (and pooler, when
    the encoder has none)."""
    encoder = load_model_dir(encoder_dir, load_tokenizer=True)
    params = random_params(encoder.config, seed=seed)
    params["bert"] = {**params["bert"], **encoder.params["bert"]}
    # A realistic head: small weights, so the probabilities are not all on one token.
    head = params["predictions"]
    head["transform"]["kernel"] = head["transform"]["kernel"] * 0.3
    save_model_dir(out, encoder.config, params, tokenizer=encoder.tokenizer)
    return out


def _wordpiece_model(root, hf_encoder):
    """A Hugging Face encoder converted, under a random head, and exported back: (the bert-jax
    model, its Hugging Face export); the encoder alone stays beside the model (`encoder/`)."""
    convert("hf", hf_encoder, "bert-jax", root / "encoder")
    model = _with_random_head(root / "encoder", root / "model")
    convert("bert-jax", model, "hf", root / "hf")
    return model, root / "hf"


@pytest.fixture(scope="module")
def wordpiece_model(tmp_path_factory):
    """The real all-MiniLM-L6-v2 encoder (6 layers, 384 wide) under a random head."""
    return _wordpiece_model(tmp_path_factory.mktemp("wordpiece"), minilm_dir())


@pytest.fixture(scope="module")
def small_wordpiece_model(tmp_path_factory):
    """all-MiniLM-L6-v2's WordPiece vocabulary and tokenizer files with a random one-layer,
    32-wide encoder in place of its weights (512 positions, as MiniLM's), under a random head:
    for the tests of the command's output and refusals, which the encoder's size does not
    change (test_candidates_match_transformers_fill_mask_pipeline reads the real weights)."""
    import shutil

    import torch

    from tests.helpers import hf_config

    root = tmp_path_factory.mktemp("small_wordpiece")
    hf_encoder = root / "hf_encoder"
    hf_encoder.mkdir()
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(minilm_dir(), name), hf_encoder / name)
    config = tiny_config(
        vocab_size=30522,
        num_hidden_layers=1,
        hidden_size=32,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    transformers.BertModel(hf_config(config)).save_pretrained(hf_encoder)
    return _wordpiece_model(root, hf_encoder)


@pytest.fixture(scope="module")
def sentencepiece_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentencepiece")
    text = root / "corpus.txt"
    sentences = [s for d in corpus.embedded_documents("train")[:60] for s in d]
    text.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    tokenizer = train_sentencepiece([text], 400, root / "spm", lowercase=True, num_threads=1)
    config = tiny_config(vocab_size=400, num_hidden_layers=2, hidden_size=32, intermediate_size=64)
    save_model_dir(root / "model", config, random_params(config, seed=1), tokenizer=tokenizer)
    convert("bert-jax", root / "model", "hf", root / "hf")
    return root / "model", root / "hf"


def _reference(hf_dir, texts, top_k=TOP_K):
    """transformers' fill-mask pipeline: per text, a list (one per [MASK]) of candidates (id,
    score, token_str: the token decoded, what the pipeline shows)."""
    pipe = transformers.pipeline("fill-mask", model=str(hf_dir), top_k=top_k, device="cpu")
    out = []
    for text in texts:
        result = pipe(text)
        per_mask = result if isinstance(result[0], list) else [result]
        out.append([[(c["token"], c["score"], c["token_str"]) for c in mask] for mask in per_mask])
    return out


def _check_same(ours, reference):
    assert len(ours) == len(reference)
    for filled, expected in zip(ours, reference):
        assert len(filled.masks) == len(expected), filled.text
        for mask, candidates in zip(filled.masks, expected):
            assert [c.token_id for c in mask.candidates] == [i for i, _, _ in candidates]
            np.testing.assert_allclose(
                [c.score for c in mask.candidates], [s for _, s, _ in candidates], rtol=0, atol=1e-5
            )
            # The words transformers shows ("the"), not the vocabulary's pieces ("▁the").
            assert [c.token_str for c in mask.candidates] == [t for _, _, t in candidates]


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
def test_candidates_match_transformers_fill_mask_pipeline(kind, request):
    model, hf_dir = request.getfixturevalue(f"{kind}_model")
    ours = fill_mask(str(model), TEXTS, top_k=TOP_K, batch_size=3)  # two batches, one padded
    _check_same(ours, _reference(hf_dir, TEXTS))
    assert [len(f.masks) for f in ours] == [1, 2, 1, 3]
    top = ours[0].masks[0].candidates
    assert all(a.score >= b.score for a, b in zip(top, top[1:])) and 0 < top[0].score <= 1
    tokenizer = load_model_dir(model, load_params=False).tokenizer
    assert [c.token for c in top] == tokenizer.convert_ids_to_tokens([c.token_id for c in top])
    if kind == "sentencepiece":  # the raw pieces stay in the result beside the words
        every = [c for f in ours for m in f.masks for c in m.candidates]
        assert any(c.token == "\u2581" + c.token_str for c in every)


def test_the_command_prints_for_people_and_json_for_scripts(
    small_wordpiece_model, tmp_path, capsys
):
    model, hf_dir = small_wordpiece_model
    texts = tmp_path / "texts.txt"
    texts.write_text(f"{TEXTS[0]}\n\n{TEXTS[1]}\n", encoding="utf-8")  # a blank line is skipped
    argv = ["fill-mask", "--model", str(model), "--top-k", "3"]
    assert cli.main([*argv, "--input", str(texts), "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["text"] for r in records] == TEXTS[:2]
    reference = _reference(hf_dir, TEXTS[:2], top_k=3)
    for record, expected in zip(records, reference):
        for mask, candidates in zip(record["masks"], expected, strict=True):
            assert [p["token_id"] for p in mask["predictions"]] == [i for i, _, _ in candidates]
            assert set(mask["predictions"][0]) == {"token_id", "token", "token_str", "score"}
    assert records[0]["masks"][0]["position"] == 6  # [CLS] the capital of france is [MASK]

    assert cli.main([*argv, TEXTS[0], TEXTS[1]]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == TEXTS[0] and out[2] == TEXTS[1]
    first = records[0]["masks"][0]["predictions"][0]
    assert out[1].startswith(f"  [MASK]: {first['token_str']} {100 * first['score']:.3g}%  ")
    assert out[3].startswith("  [MASK] 1: ") and out[4].startswith("  [MASK] 2: ")
    assert len(out) == 5


def test_bad_input_is_one_line(small_wordpiece_model, tmp_path, capsys):
    model, _ = small_wordpiece_model

    def error(*argv) -> str:
        assert cli.main(["fill-mask", "--model", str(model), *argv]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    texts = tmp_path / "texts.txt"
    texts.write_text(f"{TEXTS[0]}\n\nno mask on this line\n", encoding="utf-8")
    assert error("--input", str(texts)).endswith(
        f"{texts} line 3 has no [MASK] to fill: 'no mask on this line'"
    )
    assert "TEXT 2 has no [MASK]" in error(TEXTS[0], "a [mask] in lower case is text")
    assert "not both" in error("--input", str(texts), TEXTS[0])
    assert "not neither" in error()
    assert error("--top-k", "0", TEXTS[0]) == "bert-jax fill-mask: error: --top-k 0 must be >= 1"
    assert error("--batch-size", "0", TEXTS[0]).endswith("--batch-size 0 must be >= 1")
    assert "more than the model's 512 positions" in error(" ".join(["word"] * 600) + " [MASK]")
    assert "--input" in error("--input", str(tmp_path / "missing.txt"))


def test_a_model_without_a_masked_lm_head_is_refused(small_wordpiece_model, tmp_path, capsys):
    model, _ = small_wordpiece_model
    encoder = model.parent / "encoder"  # real MiniLM weights, no pretraining heads
    assert cli.main(["fill-mask", "--model", str(encoder), TEXTS[0]]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"bert-jax fill-mask: error: {encoder} has no masked-LM head (an encoder-only model, as "
        "converted from a sentence-transformers checkpoint or with --drop-heads): fill-mask "
        "needs a model with its pretraining heads"
    )

    config = tiny_config(objective="ltr", vocab_size=30522, num_hidden_layers=1)
    save_model_dir(tmp_path / "ltr", config, random_params(config), tokenizer=model / "tokenizer")
    assert cli.main(["fill-mask", "--model", str(tmp_path / "ltr"), TEXTS[0]]) == 2
    assert "left-to-right model (objective 'ltr')" in capsys.readouterr().err


def test_a_pretraining_workdir_is_read_from_its_latest_checkpoint(sentencepiece_model, tmp_path):
    """A run still training: its checkpoint's params (the vocabulary padded to a multiple of
    128, as the configs pad it) and the tokenizer it keeps; the Python entry point takes a
    path or a loaded model alike."""
    from bert_jax.training import checkpointing, config_lib
    from bert_jax.training.load_model import load_model_dir as load_model

    model, _ = sentencepiece_model
    tokenizer = load_model_dir(model, load_params=False).tokenizer
    run_config = config_lib.pretraining_config("tiny")
    run_config.model.update(
        vocab_size=400, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        num_hidden_layers=1, max_position_embeddings=64,
    )  # fmt: skip
    config = config_lib.bert_config(run_config)
    assert config.padded_vocab_size == 512
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "config.json").write_text(run_config.to_json_best_effort(), encoding="utf-8")
    tokenizer.save(str(workdir / "tokenizer"))
    checkpoints = checkpointing.Checkpointer(str(workdir / "checkpoints"), async_save=False)
    state = {"params": random_params(config, seed=3), "step": np.int32(4)}
    checkpoints.save(4, state, np.zeros((1, 4), np.int32))
    checkpoints.wait()
    checkpoints.close()

    exported = ["convert", "--from", "bert-jax", str(workdir), "--to", "hf", str(tmp_path / "hf")]
    assert cli.main(exported) == 0
    ours = fill_mask(str(workdir), TEXTS[:2])
    _check_same(ours, _reference(tmp_path / "hf", TEXTS[:2]))
    assert fill_mask(load_model(workdir), TEXTS[:2]) == ours
    assert fill_mask(str(workdir), []) == []


@pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="libtpu (jax[tpu]) is not installed"
)
def test_the_python_api_prints_nothing_of_libtpu_without_a_chip(sentencepiece_model):
    """A program that imports JAX and the library, then calls fill_mask and encode_texts (on a
    model its own loader read), on a host with libtpu and no TPU chip: as quiet as the CLI (no
    `E0000 ... unexpected worker hostname` from libtpu on stderr)."""
    model, _ = sentencepiece_model
    script = textwrap.dedent(
        f"""
        import jax
        from bert_jax.convert.model_dir import load_model_dir
        from bert_jax.inference.encode import encode_texts
        from bert_jax.inference.fill_mask import fill_mask

        print(fill_mask({str(model)!r}, ["the [MASK] of it"])[0].masks[0].candidates[0].token_id)
        loaded = load_model_dir({str(model)!r}, load_tokenizer=True)
        print(encode_texts(loaded, ["the end of it"]).features.shape)
        print(jax.devices()[0].platform)
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_PLATFORMS", "TPU_"))}
    env.pop("BERT_JAX_SET_JAX_PLATFORMS", None)
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "cpu"
    for noise in ("libtpu", "TPU", "E0000", "INVALID_ARGUMENT"):
        assert noise not in proc.stderr, proc.stderr[-3000:]
