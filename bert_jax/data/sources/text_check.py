"""Input that is not text refused in one line: a NUL byte (an image, a library) or bytes that are
not UTF-8 (say Latin-1), named by file and line.

``TextCheck`` is fed a file's bytes in pieces as they are read, so checking costs no read of its
own: the readers of a split that starts a file (``splits.read_split``) feed it the file's first
``SNIFF_BYTES`` (``sniffed``); further bad bytes are the readers' to count and skip, or with
``--strict`` to refuse. ``manifest.check_text_inputs`` feeds it whole files (a tokenizer's corpus).
"""

from __future__ import annotations

import codecs

from bert_jax.runtime.errors import UserError

# A text input's first bytes, checked to be text where they are read.
SNIFF_BYTES = 1 << 16
_CHUNK = 1 << 20


class InputError(UserError):
    """An input file that cannot be prepared (not text, not UTF-8) or that changed."""


class TextCheck:
    """Fed a file's bytes in pieces; raises InputError at the first NUL byte or bad UTF-8.

    Lines are counted only when there is an error (counting every piece would cost as much as
    the check): the file is read again up to the bad byte, with ``opener(path)`` (a binary
    stream; decompressed where the check is fed decompressed bytes)."""

    def __init__(self, path: str, opener=lambda path: open(path, "rb")):  # noqa: SIM115
        self.path, self.opener, self.offset = path, opener, 0
        self.decoder = codecs.getincrementaldecoder("utf-8")()

    def _line(self, offset: int) -> int:
        lines, left = 1, offset
        with self.opener(self.path) as stream:
            while left > 0 and (chunk := stream.read(min(_CHUNK, left))):
                lines, left = lines + chunk.count(b"\n"), left - len(chunk)
        return lines

    def feed(self, chunk: bytes) -> None:
        if b"\x00" in chunk:
            where = self._line(self.offset + chunk.index(b"\x00"))
            raise InputError(
                f"{self.path}: binary data, not text (a NUL byte on line {where}); "
                "give text files only"
            )
        try:
            if not (chunk.isascii() and not self.decoder.getstate()[0]):  # ASCII: valid as it is
                self.decoder.decode(chunk)
        except UnicodeDecodeError as err:
            pending = len(err.object) - len(chunk)  # bytes held over from the piece before
            where = self._line(self.offset + max(0, err.start - pending))
            raise InputError(
                f"{self.path}: not UTF-8 text (byte 0x{err.object[err.start]:02X} on line "
                f"{where}); convert it first, e.g. iconv -f latin1 -t utf-8"
            ) from None
        self.offset += len(chunk)

    def finish(self) -> None:
        try:
            self.decoder.decode(b"", final=True)
        except UnicodeDecodeError:
            raise InputError(f"{self.path}: not UTF-8 text (it ends inside a character)") from None


class sniffed:  # noqa: N801 (a stream, used as a function)
    """``stream`` (read by ``readline``), its first ``SNIFF_BYTES`` fed to a ``TextCheck`` of
    ``path`` as they are read (``opener`` reopens it to name a bad line)."""

    def __init__(self, stream, path: str, opener):
        self.stream, self.left = stream, SNIFF_BYTES
        self.check = TextCheck(path, opener)

    def readline(self, size: int = -1) -> bytes:
        if self.left == SNIFF_BYTES and hasattr(self.stream, "peek"):
            # A NUL byte anywhere in the first bytes says binary, before a line's bad UTF-8
            # does (an image's first line): looked at in the buffer, not read again.
            head = self.stream.peek(SNIFF_BYTES)[:SNIFF_BYTES]
            if b"\x00" in head:
                self.check.feed(head)
        line = self.stream.readline(size)
        if self.left > 0 and line:
            self.check.feed(line[: self.left])  # may end inside a character: no finish
            self.left -= len(line)
        return line
