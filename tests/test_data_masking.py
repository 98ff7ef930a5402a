"""Masked-LM masking (static): whole words, and random replacements from ordinary tokens only."""

from __future__ import annotations

import numpy as np

from bert_jax.data.instances import sentence_pairs as instances_lib
from bert_jax.data.instances.sentence_pairs import create_instances, instances_to_arrays
from bert_jax.data.masking.settings import MaskingConfig
from bert_jax.data.masking.static_sequence import mask_instance
from bert_jax.data.sources import embedded as sources
from bert_jax.data.tokenizers.load_or_train import load_tokenizer
from tests.data_fixtures import embedded_spm, embedded_tokenized, masking_config, minilm_vocab_path


def _restore(arrays: dict) -> np.ndarray:
    """Original (unmasked) ids: the masked positions get their labels back."""
    restored = arrays["input_ids"].copy()
    rows, slots = np.nonzero(arrays["masked_lm_weights"])
    restored[rows, arrays["masked_lm_positions"][rows, slots]] = arrays["masked_lm_ids"][
        rows, slots
    ]
    return restored


def test_whole_word_masking_masks_whole_words_and_decides_per_word():
    tokenizer = embedded_spm()
    masking = masking_config(whole_word_mask=True)
    instances = create_instances(embedded_tokenized(), masking, max_seq_length=128, seed=5)
    arrays = instances_to_arrays(instances, 128, 20)
    restored = _restore(arrays)
    word_start = tokenizer.word_start_table
    special = np.isin(restored, [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id])
    starts = word_start[restored] | special | np.roll(special, 1, axis=1)
    word_ids = np.cumsum(starts, axis=1)
    word_counts = {"mask": 0, "random": 0, "keep": 0}
    for row in range(len(instances)):
        valid = arrays["masked_lm_weights"][row] > 0
        positions = arrays["masked_lm_positions"][row][valid]
        assert len(positions) <= 20
        selected_words = np.unique(word_ids[row][positions])
        word_positions = np.flatnonzero(np.isin(word_ids[row], selected_words))
        np.testing.assert_array_equal(positions, word_positions)  # whole words only
        for word in selected_words:
            at = np.flatnonzero(word_ids[row] == word)
            seen = arrays["input_ids"][row][at]
            if (seen == tokenizer.mask_id).all():
                word_counts["mask"] += 1
            elif (seen == restored[row][at]).all():
                word_counts["keep"] += 1
            else:
                assert not (seen == tokenizer.mask_id).any()  # one decision per word
                word_counts["random"] += 1
    total = sum(word_counts.values())
    assert total > 10_000
    assert abs(word_counts["mask"] / total - 0.8) < 0.015
    assert abs(word_counts["random"] / total - 0.1) < 0.015
    assert abs(word_counts["keep"] / total - 0.1) < 0.015


def test_wordpiece_random_replacements_avoid_special_and_unused_tokens():
    tokenizer = load_tokenizer(minilm_vocab_path())
    documents = instances_lib.tokenize_documents(sources.embedded_documents("eval"), tokenizer)
    masking = MaskingConfig.from_tokenizer(tokenizer, 0.15, 20)
    rng = np.random.default_rng(0)
    input_ids = np.asarray([tokenizer.cls_id, *documents[0][0], tokenizer.sep_id], dtype=np.int32)
    replacements = []
    for _ in range(3000):
        masked, positions, labels = mask_instance(input_ids, masking, rng)
        np.testing.assert_array_equal(input_ids[positions], labels)
        changed = masked[positions]
        replacements.extend(changed[(changed != tokenizer.mask_id) & (changed != labels)].tolist())
    assert len(replacements) > 500
    vocab = tokenizer.vocab
    assert not any(vocab[i].startswith("[") and vocab[i].endswith("]") for i in replacements)


def test_masking_with_known_candidates_draws_the_same():
    """Candidates given by the caller (the instance layout) or found by a scan: same masking."""
    from bert_jax.data.masking.static_sequence import mask_ids

    tokenizer = load_tokenizer(minilm_vocab_path())
    for whole_word_mask in (False, True):
        masking = MaskingConfig.from_tokenizer(tokenizer, 0.15, 20, whole_word_mask)
        documents = instances_lib.tokenize_documents(sources.embedded_documents("eval"), tokenizer)
        scanned, given, arrays = (np.random.default_rng(1) for _ in range(3))
        cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
        for sentences in documents[:20]:
            a, b = sentences[0][:40], sentences[-1][:40]
            ids = [cls_id, *a, sep_id, *b, sep_id]
            candidates = [*range(1, len(a) + 1), *range(len(a) + 2, len(ids) - 1)]
            expected = mask_ids(ids, masking, scanned)
            assert mask_ids(ids, masking, given, candidates) == expected
            masked, positions, labels = mask_instance(np.asarray(ids), masking, arrays)
            assert masked.tolist() == expected[0] and positions.tolist() == expected[1]
            assert masked.dtype == positions.dtype == labels.dtype == np.int32


def test_a_draw_becomes_mask_random_or_same_alike_on_floats_numpy_and_tensorflow():
    """MaskingConfig.outcomes is the one threshold rule of static (Python floats in
    ``mask_ids``, NumPy arrays in ``row_masking``) and dynamic (tf tensors) masking."""
    import dataclasses

    import tensorflow as tf

    draws = [0.0, 0.5, 0.79, 0.81, 0.89, 0.91, 0.99]
    for shares, expected in (
        ({}, "MMMRRSS"),  # the paper's 80/10/10
        ({"mask_share": 0.5, "random_share": 0.3}, "MRRSSSS"),
    ):
        masking = dataclasses.replace(masking_config(), **shares)
        kinds = []
        for draw in draws:
            to_mask, to_random = masking.outcomes(draw)
            kinds.append("M" if to_mask else "R" if to_random else "S")
        assert "".join(kinds) == expected
        want_mask = np.asarray([k == "M" for k in expected])
        want_random = np.asarray([k == "R" for k in expected])
        for array in (np.asarray(draws), tf.constant(draws, dtype=tf.float32)):
            to_mask, to_random = masking.outcomes(array)
            np.testing.assert_array_equal(np.asarray(to_mask), want_mask)
            np.testing.assert_array_equal(np.asarray(to_random), want_random)


def test_every_masking_path_masks_the_count_of_the_one_rule():
    """``MaskingConfig.num_to_predict`` is google-research/bert's count, ``min(max_predictions,
    max(1, int(round(n * masked_lm_prob))))``, over the ``n`` candidates (at most ``n``); Python
    (``mask_ids``), NumPy (``mask_rows``) and TensorFlow (``dynamic_mask_batch``) mask that many.
    190 and 350 candidates at 0.15 round apart in float32 (28.5 and 52.5 there, just under in
    float64): a path that computes the count its own way in float32 fails here."""
    import tensorflow as tf

    from bert_jax.data.masking.dynamic_batch import dynamic_mask_batch
    from bert_jax.data.masking.static_rows import mask_rows
    from bert_jax.data.masking.static_sequence import mask_ids

    masking = masking_config(masked_lm_prob=0.15, max_predictions_per_seq=64)
    candidates = [0, 1, 3, 6, 7, 10, 30, 190, 350, 400]
    want = [0 if n == 0 else min(64, max(1, int(round(n * 0.15))), n) for n in candidates]
    assert [masking.num_to_predict(n) for n in candidates] == want
    assert masking.num_to_predict_table(400)[candidates].tolist() == want

    width = max(candidates) + 2
    ids = np.full((len(candidates), width), masking.pad_id, dtype=np.int32)
    ordinary = masking.ordinary_ids
    for row, n in enumerate(candidates):
        ids[row, : n + 2] = [
            masking.cls_id,
            *ordinary[np.arange(n) % len(ordinary)],
            masking.sep_id,
        ]
    lengths = np.asarray(candidates) + 2
    python = [
        len(mask_ids(ids[r, : lengths[r]].tolist(), masking, np.random.default_rng(r))[1])
        for r in range(len(candidates))
    ]
    numpy_counts = mask_rows(ids, lengths, masking, np.random.default_rng(0))[3]
    slots = masking.max_predictions_per_seq
    batch = {
        "input_ids": tf.constant(ids),
        "input_mask": tf.constant((np.arange(width) < lengths[:, None]).astype(np.int32)),
        "masked_lm_positions": tf.zeros((len(candidates), slots), tf.int32),
        "masked_lm_ids": tf.zeros((len(candidates), slots), tf.int32),
        "masked_lm_weights": tf.zeros((len(candidates), slots), tf.float32),
    }
    dynamic = dynamic_mask_batch(batch, tf.constant([1, 2], tf.int64), masking)
    tf_counts = dynamic["masked_lm_weights"].numpy().sum(axis=1).astype(int)
    assert python == numpy_counts.tolist() == tf_counts.tolist() == want


def _package_files():
    import pathlib

    import bert_jax

    root = pathlib.Path(bert_jax.__file__).parent
    return root, sorted(root.rglob("*.py"))


def test_the_default_masking_shares_are_written_once_in_the_package():
    """0.8 (the [MASK] share, in a tuple, a dict or a constant) appears in the package's code
    once: data/objectives.py's PAPER_SHARES, which the config, the data layer and the command
    line read."""
    import io
    import tokenize

    root, files = _package_files()
    found = []
    for path in files:
        source = path.read_text(encoding="utf-8")
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.NUMBER and token.string.replace("_", "").lower() in (
                "0.8",
                ".8",
                "8e-1",
                "0.80",
            ):
                found.append(f"{path.relative_to(root)}:{token.start[0]}")
    assert len(found) == 1 and found[0].startswith("data/objectives.py:"), found


_MASKING_DEFAULTS = {
    "mask_share": 0.8,
    "same_share": 0.1,
    "random_share": 0.1,
    "masked_lm_prob": 0.15,
    "max_predictions_per_seq": 20,
    "objective": "mlm+nsp",
    "short_seq_prob": 0.1,
}


def _literal_defaults(tree):
    """(setting, line) where a masking setting gets its default as a literal: an assignment or
    field, a parameter default, a keyword, a dict entry, ``.get(key, default)`` or an
    ``add_argument(flag, default=...)``."""
    import ast

    for node in ast.walk(tree):
        pairs = []
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                pairs.append((getattr(target, "id", getattr(target, "attr", None)), node.value))
        elif isinstance(node, ast.arguments):
            positional = node.posonlyargs + node.args
            pairs += zip(
                [a.arg for a in positional[len(positional) - len(node.defaults) :]], node.defaults
            )
            pairs += zip([a.arg for a in node.kwonlyargs], node.kw_defaults)
        elif isinstance(node, ast.Dict):
            pairs += [
                (k.value, v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)
            ]
        elif isinstance(node, ast.Call):
            pairs += [(kw.arg, kw.value) for kw in node.keywords]
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                pairs += [(first.value, value) for value in node.args[1:2]]
                pairs += [(first.value, kw.value) for kw in node.keywords if kw.arg == "default"]
        for name, value in pairs:
            setting = name.lstrip("-").replace("-", "_") if isinstance(name, str) else None
            if setting in _MASKING_DEFAULTS and isinstance(value, ast.Constant):
                default = _MASKING_DEFAULTS[setting]
                if type(value.value) is type(default) and value.value == default:
                    yield setting, value.lineno


def test_masking_settings_take_their_defaults_from_data_objectives():
    """No module of the data layer, the training config and metrics, bench's data or `data
    prepare`'s flags writes a masking default (or the short-instance share) itself. (core/
    keeps its own OBJECTIVES: core may not import data; tests/test_objectives.py checks the two
    are equal.)"""
    import ast

    root, files = _package_files()
    checked = [
        path
        for path in files
        if path.relative_to(root).parts[0] == "data"
        or path.relative_to(root).as_posix()
        in ("training/config_lib.py", "training/heldout_eval.py", "cli/data.py", "bench/data.py")
    ]
    assert len(checked) > 10
    found = [
        f"{path.relative_to(root)}:{line} {setting}"
        for path in checked
        for setting, line in _literal_defaults(ast.parse(path.read_text(encoding="utf-8")))
        if path.name != "objectives.py"
    ]
    assert found == []
