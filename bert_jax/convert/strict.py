"""Strict, tensor-by-tensor import of a named checkpoint into bert-jax params, and its report.

Every importer (Hugging Face, Google TF1) goes through `import_params`: each bert-jax parameter must
be filled from exactly one source tensor of the right shape, and each source tensor must be used or
explicitly ignored for a stated reason (an optimizer slot, a tied copy, a buffer). Anything else
raises `ConversionError` naming the tensor, before any output is written.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flax import traverse_util

from bert_jax.convert import mapping
from bert_jax.core.model import BertConfig
from bert_jax.runtime.errors import UserError


class ConversionError(UserError):
    """A checkpoint does not match the model it is converted to; the message names the tensor."""


@dataclasses.dataclass
class ConversionReport:
    """What a conversion read, used, ignored and wrote."""

    source_format: str
    source: str
    target_format: str | None = None
    target: str | None = None
    config: BertConfig | None = None
    has_heads: bool = False
    tensors_read: int = 0
    used: list[str] = dataclasses.field(default_factory=list)
    # source tensor name -> why it was not used ("optimizer slot", "tied to ...", ...)
    ignored: dict[str, str] = dataclasses.field(default_factory=dict)
    num_parameters: int = 0
    tokenizer: str | None = None
    written: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    # A fine-tuned model's head, as the summary names it ("classification head,
    # BertForSequenceClassification"); None for a pretrained model (MLM/NSP heads or none).
    task_head: str | None = None

    def ignored_by_reason(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for reason in self.ignored.values():
            counts[reason] = counts.get(reason, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["config"] = None if self.config is None else self.config.to_dict()
        out["ignored_by_reason"] = self.ignored_by_reason()
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def summary(self) -> str:
        """A few human-readable lines (what `bert-jax convert` prints)."""
        cfg = self.config
        lines = [
            f"converted {self.source_format} {self.source} -> {self.target_format} {self.target}"
        ]
        if cfg is not None:
            lines.append(
                f"  model: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
                f"{cfg.num_attention_heads} heads, intermediate {cfg.intermediate_size}, "
                f"vocab {cfg.vocab_size}, hidden_act {cfg.hidden_act!r}"
            )
        heads = self.task_head or (
            "MLM and NSP heads converted"
            if self.has_heads
            else "encoder only (no MLM/NSP pretraining heads in the output)"
        )
        lines.append(f"  heads: {heads}")
        lines.append(
            f"  tensors: {self.tensors_read} read, {len(self.used)} used, "
            f"{len(self.ignored)} ignored; {self.num_parameters:,} parameters (vocabulary "
            "padding rows not counted)"
        )
        for reason, count in sorted(self.ignored_by_reason().items()):
            lines.append(f"    ignored {count}: {reason}")
        lines.append(f"  tokenizer: {self.tokenizer or 'none'}")
        for note in self.notes:
            lines.append(f"  note: {note}")
        if self.written:
            lines.append(f"  wrote: {', '.join(self.written)}")
        return "\n".join(lines)


# Said after a failed import only where it helps: the heads are the problem, the encoder matches.
DROP_HEADS_HINT = "(to convert the encoder alone, drop the heads: --drop-heads)"


def encoder_matches(shapes: Mapping[str, Sequence[int]], config: BertConfig, source: str) -> bool:
    """Whether every encoder tensor (with the pooler) is in `shapes` with the shape `config`
    needs: what `--drop-heads` would convert, so `DROP_HEADS_HINT` is offered only then."""
    return all(
        tuple(int(n) for n in shapes.get(mapping.source_name(entry, source), ()))
        == mapping.source_shape(entry, config, source)
        for entry in mapping.entries(config, with_heads=False)
    )


def import_params(
    shapes: Mapping[str, Sequence[int]],
    read: Callable[[str], np.ndarray],
    config: BertConfig,
    source: str,
    *,
    with_heads: bool,
    ignore: Callable[[str], str | None] = lambda name: None,
    report: ConversionReport | None = None,
    origin: str = "checkpoint",
) -> dict[str, Any]:
    """bert-jax params (nested dict of float32 NumPy arrays) from named source tensors.

    `shapes` lists every tensor in the checkpoint (name -> shape) and `read(name)` loads one, so
    shapes are checked before anything large is read and ignored tensors (optimizer slots) are
    never read. `ignore(name)` returns the reason a tensor may go unused, or None. `origin` names
    the checkpoint in error messages.
    """
    table = mapping.entries(config, with_heads=with_heads)
    problems = []
    for entry in table:
        name = mapping.source_name(entry, source)
        want = mapping.source_shape(entry, config, source)
        if name not in shapes:
            problems.append(
                f"missing tensor {name!r} (for bert-jax {'/'.join(entry.path)}, shape {want})"
            )
        elif tuple(int(n) for n in shapes[name]) != want:
            problems.append(
                f"tensor {name!r} has shape {tuple(shapes[name])} but this config needs {want} "
                f"({_shape_hint(entry, config)})"
            )
    wanted = {mapping.source_name(entry, source) for entry in table}
    unused = []
    ignored: dict[str, str] = {}
    for name in shapes:
        if name in wanted:
            continue
        reason = ignore(name)
        if reason is None:
            unused.append(name)
        else:
            ignored[name] = reason
    if unused:
        unused.sort()
        shown = ", ".join(repr(n) for n in unused[:8])
        more = f" and {len(unused) - 8} more" if len(unused) > 8 else ""
        problems.append(
            f"{len(unused)} tensor(s) in the {origin} have no place in a BERT model with this "
            f"config: {shown}{more}"
        )
    if problems:
        head = f"{origin} does not match the model ({len(problems)} problem(s)):\n  - "
        raise ConversionError(head + "\n  - ".join(problems))

    params: dict[str, Any] = {}
    for entry in table:
        name = mapping.source_name(entry, source)
        value = np.asarray(read(name))
        # bfloat16 (ml_dtypes) is not an np.floating subtype, so refuse by kind instead.
        if value.dtype.kind in "biuSUOc":
            raise ConversionError(f"tensor {name!r} has dtype {value.dtype}, expected floats")
        converted = mapping.to_bert_jax(entry, value, config, source)
        mapping.set_path(params, entry.path, np.ascontiguousarray(converted, dtype=np.float32))
    if report is not None:
        report.config = config
        report.has_heads = with_heads
        report.tensors_read = len(shapes)
        report.used = sorted(wanted)
        report.ignored = dict(sorted(ignored.items()))
        report.num_parameters = sum(
            int(np.prod(mapping.source_shape(e, config, source))) for e in table
        )
    return params


def _shape_hint(entry: mapping.Entry, config: BertConfig) -> str:
    name = entry.path[-2] if len(entry.path) > 1 else entry.path[-1]
    if mapping.vocab_rows(entry):
        return f"vocab_size={config.vocab_size}, hidden_size={config.hidden_size}"
    if name == "position_embeddings":
        return f"max_position_embeddings={config.max_position_embeddings}"
    if name == "token_type_embeddings":
        return f"type_vocab_size={config.type_vocab_size}"
    if name in ("intermediate", "output") and entry.path[-3].startswith("layer_"):
        return f"hidden_size={config.hidden_size}, intermediate_size={config.intermediate_size}"
    return f"hidden_size={config.hidden_size}"


def check_params(params: Mapping[str, Any], config: BertConfig, what: str) -> bool:
    """Checks a bert-jax param tree against `config`; returns whether it holds the heads.

    Raises `ConversionError` naming each missing, extra or mis-shaped parameter.
    """
    has_heads = "predictions" in params or "seq_relationship" in params
    expected = {
        "/".join(e.path): mapping.expected_shape(e, config)
        for e in mapping.entries(config, with_heads=has_heads)
    }
    found = {
        path: tuple(getattr(leaf, "shape", np.shape(leaf)))
        for path, leaf in traverse_util.flatten_dict(dict(params), sep="/").items()
    }
    problems = [f"missing parameter {p} {s}" for p, s in expected.items() if p not in found]
    problems += [
        f"parameter {p} has shape {found[p]} but the config needs {s}"
        for p, s in expected.items()
        if p in found and found[p] != s
    ]
    problems += [f"unexpected parameter {p} {s}" for p, s in found.items() if p not in expected]
    if problems:
        raise ConversionError(
            f"{what} does not match its config ({len(problems)} problem(s)):\n  - "
            + "\n  - ".join(problems[:20])
        )
    return has_heads
