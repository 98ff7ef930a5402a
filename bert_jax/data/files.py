"""Atomic file writes: a hidden temporary name in the same directory, then a rename.

A reader (or a resumed job) never sees a half-written file under its final name. The temporary
name is unique per host, process and call, so several machines preparing into one shared
directory cannot collide.
"""

from __future__ import annotations

import json
import os
import socket
import uuid


def temporary_name(path: str) -> str:
    """A hidden sibling of ``path`` that no other writer can be using."""
    directory, name = os.path.split(os.path.abspath(path))
    unique = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return os.path.join(directory, f".{name}.tmp-{unique}")


def write_bytes_atomic(path: str, data: bytes) -> None:
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json_atomic(path: str, payload: dict) -> None:
    text = json.dumps(payload, indent=2, sort_keys=True) + "\n"
    write_bytes_atomic(path, text.encode("utf-8"))
