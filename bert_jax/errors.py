"""User errors: the input, a file or a setting is wrong (not a bug); the CLI says so in one line.

`bert-jax` (`bert_jax.cli`) prints every user error as one line on stderr,
`bert-jax COMMAND: error: <message>`, and exits with status 2; anything else is a bug and ends in
a traceback. So the message must name what to fix: the file (and line), the flag or the setting.

User errors are:
- `UserError` and its subclasses: raise one where nothing more specific fits;
- every `ValueError`, which covers the library's own error types (`model_dir.ModelDirError`,
  `convert.strict.ConversionError`, `finetune.tasks.GlueDataError`,
  `distributed.HostMismatchError`) and its plain checks of settings and config values;
- a path that is missing, in the way or unreadable (`FileNotFoundError`, `FileExistsError`,
  `NotADirectoryError`, `IsADirectoryError`, `PermissionError`);
- two errors about the user's setup that are `RuntimeError`s: `bench.PeerMissingError` (no peer
  environment) and `launch.LaunchError` (an invalid launch setting or a failed gcloud/sbatch).

`bert_jax.cli` holds the list that it catches; keep the two in step.
"""

from __future__ import annotations


class UserError(ValueError):
    """The user's input, file or setting is wrong; the message names it and says what to do."""
