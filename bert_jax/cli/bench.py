"""`bert-jax bench --config configs/bert.py:SIZE [--peer hf-torch]`: train-step speed and MFU."""

from __future__ import annotations

from bert_jax.bench.settings import BenchSettings
from bert_jax.cli.config_flags import ConfigCommand, declared_flags, declared_values


def _run(flag_values) -> int:
    from bert_jax.bench import report as report_lib
    from bert_jax.bench import spec as spec_lib
    from bert_jax.bench import timing

    settings = BenchSettings(**declared_values(BenchSettings, flag_values))
    spec = spec_lib.spec_from_config(flag_values.config, settings)
    report = timing.run(
        spec,
        peer=settings.peer,
        peer_python=settings.peer_python or None,
        compare_unpacked=settings.compare_unpacked,
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
        ("string", "json", None, "also write the report as JSON to this file (default: none)"),
    ),
    run=_run,
    aliases=(("seq_len", "max_seq_length"), ("batch", "batch_size")),
    times_compiles=True,  # the report gives the step's compile seconds
)
add_to = COMMAND.add_to
