"""The statistics of prepared records that the paper fixes, side by side for several records
directories (e.g. the same corpus prepared by two versions of bert-jax, or two groupings):
random-next share, masked share of the real tokens, the [MASK] / random / unchanged shares of the
masked positions, instance lengths.

    python benchmarks/prepare_grouping_stats.py --tokenizer TOK DIR [DIR ...]

Reads every record (TensorFlow); prints a Markdown table, a column per directory.
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def record_stats(directory: str, tokenizer) -> dict[str, float]:
    from bert_jax.data.layout import read_prepare_config
    from bert_jax.data.records import tfrecord as records

    recorded = read_prepare_config(directory)
    length, slots = recorded["max_seq_length"], recorded["max_predictions_per_seq"]
    batches = list(records.read_records(directory, length, slots, batch_size=100_000))
    rows = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    input_ids, mask = rows["input_ids"], rows["input_mask"]
    weights = rows["masked_lm_weights"] > 0
    positions = rows["masked_lm_positions"]
    at_positions = np.take_along_axis(input_ids, positions, axis=1)
    original = rows["masked_lm_ids"]
    lengths = mask.sum(axis=1)
    special = np.isin(input_ids, [tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id])
    real_tokens = int((mask.astype(bool) & ~special).sum())
    masked = int(weights.sum())
    is_mask = (at_positions == tokenizer.mask_id) & weights
    is_same = (at_positions == original) & weights & ~is_mask
    return {
        "instances": len(lengths),
        "random next": float(rows["next_sentence_labels"].mean()),
        "masked / real tokens": masked / real_tokens,
        "[MASK] share": float(is_mask.sum()) / masked,
        "random share": float((weights & ~is_mask & ~is_same).sum()) / masked,
        "unchanged share": float(is_same.sum()) / masked,
        "mean length": float(lengths.mean()),
        "full-length share": float((lengths == length).mean()),
        "short (< half) share": float((lengths < length // 2).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True, help="the tokenizer the records used")
    parser.add_argument("directories", nargs="+", metavar="DIR")
    args = parser.parse_args()
    from bert_jax.data.tokenizers.load_or_train import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    columns = {
        os.path.basename(os.path.normpath(d)): record_stats(d, tokenizer) for d in args.directories
    }
    names = list(columns)
    print("| statistic | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for key in next(iter(columns.values())):
        values = [columns[name][key] for name in names]
        cells = [f"{v:,}" if isinstance(v, int) else f"{v:.4f}" for v in values]
        print(f"| {key} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
