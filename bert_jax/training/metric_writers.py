"""Where a run's metrics go: rows of `metrics.jsonl` and TensorBoard events (locally or in a
bucket), read back by kind, and cut back to a resumed step."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from bert_jax.runtime import fs


def summary_writer_class() -> type:
    """tensorboardX's `SummaryWriter`, imported without PyTorch.

    tensorboardX imports torch, where it is installed, only to accept torch tensors; the writer
    here passes Python numbers. Hidden while tensorboardX is imported, it costs each training
    process 0.3 s and 70 MB instead of 1.3 s and 250 MB (measured on a host with torch, as the
    GPU images have). A torch that is already imported stays as it is, and one imported later
    imports as usual: only the name's placeholder is removed.
    """
    hide = "torch" not in sys.modules
    if hide:
        sys.modules["torch"] = None  # type: ignore[assignment]  (`import torch` raises ImportError)
    try:
        from tensorboardX import SummaryWriter
    finally:
        if hide and sys.modules.get("torch", ...) is None:
            del sys.modules["torch"]
    return SummaryWriter


class MetricWriter:
    """Writes scalars as JSONL (`metrics.jsonl`) and TensorBoard events (`tensorboard/`).

    Only process 0 writes; every process may call it. `log_dir` is created on first use.
    """

    def __init__(self, log_dir: str, enabled: bool = True, tensorboard: bool = True):
        self.log_dir = log_dir
        self.enabled = enabled
        self._jsonl = None
        self._tb = None
        self._tb_opened = 0
        self._tensorboard = tensorboard
        # In a bucket (objects are written whole, never appended to): the file's rows, uploaded
        # whole after each write; TensorBoard's events go to a local directory, uploaded likewise.
        self._remote_rows: list[str] | None = None
        self._tb_local: str | None = None

    @property
    def jsonl_path(self) -> str:
        return os.path.join(self.log_dir, "metrics.jsonl")

    @property
    def tensorboard_dir(self) -> str:
        return os.path.join(self.log_dir, "tensorboard")

    def write(self, step: int, scalars: Mapping[str, Any], kind: str = "train") -> None:
        if not self.enabled:
            return
        record = {"step": int(step), "kind": kind, **{k: _plain(v) for k, v in scalars.items()}}
        if fs.is_remote(self.log_dir):
            if self._remote_rows is None:
                old = fs.read_text(self.jsonl_path) if fs.exists(self.jsonl_path) else ""
                self._remote_rows = [old] if old else []
            self._remote_rows.append(json.dumps(record) + "\n")
            fs.write_text(self.jsonl_path, "".join(self._remote_rows))
        else:
            if self._jsonl is None:
                fs.makedirs(self.log_dir, exist_ok=True)
                self._jsonl = fs.open(self.jsonl_path, "a", encoding="utf-8")  # noqa: SIM115
            self._jsonl.write(json.dumps(record) + "\n")
            self._jsonl.flush()
        if self._tensorboard:
            if self._tb is None:
                SummaryWriter = summary_writer_class()  # noqa: N806
                target = self.tensorboard_dir
                if fs.is_remote(target):
                    self._tb_local = target = tempfile.mkdtemp(prefix="bert_jax_tb-")
                # One file per writer opened: tensorboardX names a file by the second and host
                # alone, and a writer reopened within the same second would overwrite it.
                self._tb_opened += 1
                suffix = f".{os.getpid()}.{self._tb_opened}"
                self._tb = SummaryWriter(target, filename_suffix=suffix)
            for key, value in scalars.items():
                value = _plain(value)  # NumPy scalars too
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(f"{kind}/{key}", value, int(step))
            self._tb.flush()
            self._upload_events()

    def _upload_events(self) -> None:
        if self._tb_local is None:
            return
        for name in os.listdir(self._tb_local):
            fs.upload(os.path.join(self._tb_local, name), os.path.join(self.tensorboard_dir, name))

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
            self._upload_events()
        if self._tb_local is not None:
            shutil.rmtree(self._tb_local, ignore_errors=True)
            self._tb_local = None


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return value


def read_jsonl(path: str, kind: str | None = None) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl file (optionally only one kind: train, eval, event)."""
    with fs.open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if kind is None or r.get("kind") == kind]


def drop_rows_after(path: str, step: int) -> int:
    """Removes the rows of steps after `step` from a metrics.jsonl (a run resumed at `step` logs
    them again); returns how many. Rewritten atomically (a new file renamed over the old), so an
    interruption leaves the old file or the new one. A torn last line (a killed run) goes too."""
    if not fs.exists(path):
        return 0
    kept, dropped = [], 0
    with fs.open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                dropped += bool(line.strip())
                continue
            if isinstance(row, dict) and int(row.get("step", 0)) > step:
                dropped += 1
            else:
                kept.append(line if line.endswith("\n") else line + "\n")
    if dropped and fs.is_remote(path):  # one object, replaced whole
        fs.write_text(path, "".join(kept))
    elif dropped:
        tmp = f"{path}.tmp-{os.getpid()}"
        with fs.open(tmp, "w", encoding="utf-8") as f:
            f.writelines(kept)
        fs.rename(tmp, path)
    return dropped
