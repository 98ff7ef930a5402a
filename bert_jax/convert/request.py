"""What one `bert-jax convert` asks for (`Request`), and the steps every family's path shares.

`between_formats.convert` builds the request, checks its destination once before anything is read,
and converts a BERT source itself or hands it to `hf_modernbert.convert` (a ModernBERT source) or
`hf_finetuned.convert` (a fine-tuned one). Each path reads the source's tokenizer through
`source_tokenizer` and writes through `write_output`: a model directory, or a Hugging Face export
with the marker that lets `--overwrite` replace it later, atomically either way.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from bert_jax.convert import model_dir
from bert_jax.convert.hf import HF_EXPORT_KIND, HF_EXPORT_MARKER
from bert_jax.convert.strict import ConversionError, ConversionReport
from bert_jax.runtime import fs
from bert_jax.runtime import outputs as files


@dataclasses.dataclass(frozen=True)
class Request:
    """`convert`'s arguments (see `between_formats.convert`), `src` and `dst` made absolute."""

    src_format: str
    src: str
    dst_format: str
    dst: str
    drop_heads: bool = False
    tokenizer: str | os.PathLike | None = None
    lowercase: bool | None = None
    overwrite: bool = False
    vocab_pad_multiple: int | None = None
    load_model_dir: Callable[[str], model_dir.ModelDir] = model_dir.load_model_dir


def source_tokenizer(
    found: str | None,
    given: str | os.PathLike | None,
    lowercase: bool | None,
    config: Any,
    report: ConversionReport,
) -> Any:
    """The tokenizer a conversion carries: `given` (--tokenizer) or else the one `found` with the
    source, loaded with `lowercase` and refused when it has more entries than the model's
    vocab_size; described in `report` (or noted missing). None where there is none."""
    from bert_jax.data.tokenizers.load_or_train import load_tokenizer

    origin = os.fspath(given) if given is not None else found
    if origin is None:
        report.notes.append("no tokenizer found in the source; pass --tokenizer to include one")
        return None
    tok = load_tokenizer(origin, lowercase=lowercase)
    if tok.vocab_size > config.vocab_size:
        raise ConversionError(
            f"tokenizer {origin} has {tok.vocab_size} entries but the model's vocab_size is "
            f"{config.vocab_size}: ids past the embedding table would be produced"
        )
    case = "lowercased" if tok.lowercase else "cased"
    report.tokenizer = f"{tok.kind}, {tok.vocab_size} entries, {case} (from {origin})"
    if tok.vocab_size < config.vocab_size:
        report.notes.append(
            f"the tokenizer has {tok.vocab_size} entries, the model {config.vocab_size} rows "
            "(the extra rows are never produced by the tokenizer)"
        )
    return tok


def write_output(
    request: Request,
    report: ConversionReport,
    config: Any,
    params: Mapping[str, Any],
    tokenizer: Any,
    write_hf: Callable[[str], list[str]],
    task: Mapping[str, Any] | None = None,
) -> None:
    """Writes the conversion at `request.dst`, atomically: a model directory recording its
    source (`task`: a fine-tuned one), or a Hugging Face export whose files `write_hf(folder)`
    writes (returning their names) beside the export's marker. Fills `report`'s target and
    `written`."""
    report.target_format, report.target = request.dst_format, request.dst
    if request.dst_format == "bert-jax":
        model_dir.save_model_dir(
            request.dst,
            config,
            params,
            tokenizer,
            extra={"converted_from": {"format": request.src_format, "path": report.source}},
            overwrite=request.overwrite,
            what="--to",
            task=task,
        )
        report.written = sorted(fs.listdir(request.dst))
        return
    with files.atomic_output_dir(
        request.dst, HF_EXPORT_KIND, request.overwrite, what="--to"
    ) as tmp:
        report.written = write_hf(tmp)
        files.write_json_atomic(
            os.path.join(tmp, HF_EXPORT_MARKER),
            {"written_by": "bert-jax convert", "from": request.src_format, "source": report.source},
        )
