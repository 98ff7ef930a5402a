"""`bert-jax bench --config configs/bert.py:SIZE [--peer hf-torch]`: train-step speed and MFU."""

from __future__ import annotations

from bert_jax.bench.settings import BenchSettings
from bert_jax.cli.config_flags import ConfigCommand, declared_flags, declared_values
from bert_jax.runtime import declarations


def _run(flag_values) -> int:
    from bert_jax.bench import report as report_lib
    from bert_jax.bench import spec as spec_lib
    from bert_jax.bench import timing

    spec = spec_lib.spec_from_config(
        flag_values.config,
        **declarations.as_dict(BenchSettings(**declared_values(BenchSettings, flag_values))),
        data="embedded" if flag_values.real_data or flag_values.packing else "synthetic",
        packing=flag_values.packing,
        tokenizer=flag_values.tokenizer or "",
        rng_impl=flag_values.rng_impl,
        peer_rng_impl=flag_values.peer_rng_impl,
    )
    report = timing.run(
        spec,
        peer=flag_values.peer,
        peer_python=flag_values.peer_python,
        compare_unpacked=flag_values.compare_unpacked,
    )
    print(report.render())
    if flag_values.json:
        report_lib.write_json(report, flag_values.json)
    return 0


COMMAND = ConfigCommand(
    name="bench",
    summary="training throughput (tokens/s, MFU) of the real train step, optionally beside Hugging "
    "Face's PyTorch BERT (eager and compiled) or Flax BERT: --config configs/bert.py:SIZE "
    "[--peer hf-torch]",
    own_flags=(
        *declared_flags(BenchSettings),
        (
            "string",
            "peer",
            None,
            "also time peers in the same run: hf-torch (PyTorch, eager and compiled; or "
            "hf-torch-eager, hf-torch-compiled), hf-flax; several comma-separated",
        ),
        ("string", "peer_python", None, "hf-flax's Python (default: .venv-peer/bin/python)"),
        ("bool", "real_data", False, "instances from the embedded corpus, real lengths"),
        ("bool", "packing", False, "pack several instances per row (implies --real-data)"),
        ("bool", "compare_unpacked", False, "with --packing: also time the rows unpacked"),
        (
            "string",
            "tokenizer",
            None,
            "tokenizer for --real-data (default: the embedded corpus's, see bench/data.py)",
        ),
        ("string", "rng_impl", "", "our dropout PRNG (default: config.dropout_rng_impl)"),
        ("string", "peer_rng_impl", "", "the peer's dropout PRNG (default threefry2x32)"),
        ("string", "json", None, "also write the report as JSON to this file (default: none)"),
    ),
    run=_run,
    aliases=(("seq_len", "max_seq_length"), ("batch", "batch_size")),
)
add_to = COMMAND.add_to
