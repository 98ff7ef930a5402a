"""bert_jax/runtime/fs.py without a bucket: URL arithmetic, local behaviour through fsspec, errors
as one line (remote) or left as they are (local).

The same functions against a Cloud Storage emulator: tests/test_gcs.py (`make test-gcs`).
"""

from __future__ import annotations

import contextlib
import os
import time

import fsspec
import pytest

from bert_jax.runtime import fs
from bert_jax.runtime.errors import UserError


def test_urls_take_os_path_once_made_absolute():
    assert fs.is_remote("gs://b/x") and not fs.is_remote("/tmp/x")
    assert fs.abspath("gs://b/run/model/") == "gs://b/run/model"
    assert fs.abspath("gs://b/") == "gs://b" and fs.abspath("gs://") == "gs://"
    assert os.path.join("gs://b/run/", "checkpoints", "4") == "gs://b/run/checkpoints/4"
    assert os.path.dirname(fs.abspath("gs://b/run/model/")) == "gs://b/run"
    assert os.path.basename(fs.abspath("gs://b/run/model/")) == "model"
    assert fs.bucket("gs://my-bucket/a/b") == "my-bucket"


def test_local_paths_behave_as_os(tmp_path):
    path = str(tmp_path / "a" / "b.txt")
    fs.makedirs(os.path.dirname(path))
    with pytest.raises(FileExistsError):
        fs.makedirs(os.path.dirname(path))
    fs.write_text(path, "hello")
    assert fs.read_text(path) == "hello" and fs.getsize(path) == 5
    assert fs.listdir(os.path.dirname(path)) == ["b.txt"]
    assert fs.glob(str(tmp_path / "a" / "*.txt")) == [path]
    assert list(fs.walk_files(str(tmp_path))) == [path]
    fs.rename(path, path + ".new")
    assert not fs.exists(path) and fs.isfile(path + ".new")
    assert abs(time.time() - fs.modified(path + ".new").timestamp()) < 60


def test_create_exclusive_has_one_winner(tmp_path):
    path = str(tmp_path / "lock")
    assert fs.create_exclusive(path, b"first")
    assert not fs.create_exclusive(path, b"second")
    assert fs.read_bytes(path) == b"first"


def test_rename_between_disk_and_bucket_is_refused(tmp_path):
    with pytest.raises(ValueError, match="one is local"):
        fs.rename(str(tmp_path / "x"), "gs://b/x")


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (type("DefaultCredentialsError", (Exception,), {})("none"), "no Google Cloud credentials"),
        (OSError("Forbidden: b/x\ncaller has no access"), "permission denied on gs://b/x"),
        (RuntimeError("503 Service Unavailable"), "Cloud Storage failed on gs://b/x after retries"),
    ],
)
def test_storage_errors_are_one_user_error_line_naming_the_url(error, expected):
    with pytest.raises(fs.StorageError) as raised, fs._remote_errors("gs://b/x"):  # noqa: SLF001
        raise error
    assert isinstance(raised.value, UserError)
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_missing_and_existing_pass_through_unchanged():
    for error in (FileNotFoundError("gs://b/x"), FileExistsError("gs://b/x")):
        with pytest.raises(type(error)), fs._remote_errors("gs://b/x"):  # noqa: SLF001
            raise error


def test_epath_goes_through_gcsfs_unless_the_user_chose():
    assert os.environ.get("EPATH_USE_TF") is not None


def test_read_range_and_local_then_place_on_disk(tmp_path):
    from bert_jax.runtime import outputs

    path = str(tmp_path / "f.bin")
    fs.write_bytes(path, b"0123456789")
    assert fs.read_bytes(path, 2, 5) == b"234" and fs.read_bytes(path, 8, 20) == b"89"
    target = str(tmp_path / "plot.png")
    with outputs.local_then_place(target, ".png") as local:
        assert local.endswith(".png") and local != target
        with open(local, "wb") as f:
            f.write(b"png")
    assert open(target, "rb").read() == b"png"
    with pytest.raises(RuntimeError), outputs.local_then_place(str(tmp_path / "x.png")) as local:
        open(local, "wb").close()
        raise RuntimeError
    assert sorted(os.listdir(tmp_path)) == ["f.bin", "plot.png"]  # nothing half-written left


def test_local_errors_are_left_as_the_os_raised_them(tmp_path):
    """A local OSError is no user error here: the caller that opened a user's path decides."""
    with pytest.raises(PermissionError) as raised, fs._remote_errors(str(tmp_path)):  # noqa: SLF001
        raise PermissionError(13, "denied")
    assert not isinstance(raised.value, UserError)
    for call in (fs.read_text, fs.getsize, fs.remove, fs.listdir, fs.rmtree):
        with pytest.raises(FileNotFoundError):
            call(str(tmp_path / "missing"))
    fs.write_text(str(tmp_path / "f"), "x")
    with pytest.raises(NotADirectoryError):
        fs.listdir(str(tmp_path / "f"))
    assert not fs.exists("") and not fs.isdir("")  # fsspec alone would take the working dir
    with pytest.raises(FileNotFoundError):
        fs.read_bytes("")


def test_relative_paths_stay_relative_and_wildcards_skip_dot_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("d/a.txt", "d/.hidden.txt", "d/sub/b.txt", "d/.cache/c.txt"):
        fs.makedirs(os.path.dirname(name), exist_ok=True)
        fs.write_text(name, name)
    assert fs.glob("d/*.txt") == ["d/a.txt"] and fs.glob("./d/*/*.txt") == ["./d/sub/b.txt"]
    assert fs.glob("d/.*.txt") == ["d/.hidden.txt"]  # named by the pattern: found
    assert sorted(fs.walk_files("d/")) == [
        "d/.cache/c.txt",
        "d/.hidden.txt",
        "d/a.txt",
        "d/sub/b.txt",
    ]
    assert fs.listdir("d") == [".cache", ".hidden.txt", "a.txt", "sub"]


def test_local_rename_is_os_rename(tmp_path):
    """Atomic, replacing a file; never moving into an existing directory (as shutil.move)."""
    a, b, full = (str(tmp_path / n) for n in ("a", "b", "full"))
    fs.write_text(a, "new")
    fs.write_text(b, "old")
    fs.rename(a, b)
    assert fs.read_text(b) == "new" and not fs.exists(a)
    fs.makedirs(a)
    fs.makedirs(os.path.join(full, "x"))
    with pytest.raises(OSError):
        fs.rename(a, full)
    assert fs.listdir(full) == ["x"] and fs.isdir(a)


def test_copies_to_local_disk_land_whole_or_not_at_all(tmp_path):
    source = tmp_path / "src"
    fs.makedirs(str(source / "sub"))
    fs.write_text(str(source / "sub" / "x.txt"), "x")
    fs.write_text(str(source / "y.txt"), "y")
    copy = str(tmp_path / "copy")
    assert fs.copy_to_local(str(source), copy) == copy
    assert sorted(fs.walk_files(copy)) == [f"{copy}/sub/x.txt", f"{copy}/y.txt"]
    with pytest.raises(FileExistsError):  # a tree never replaces one
        fs.copy_to_local(str(source), copy)
    fs.upload(str(source / "y.txt"), str(tmp_path / "z.txt"))
    fs.upload(str(source), str(tmp_path / "uploaded"))
    assert fs.read_text(str(tmp_path / "z.txt")) == "y"
    assert fs.read_text(str(tmp_path / "uploaded" / "sub" / "x.txt")) == "x"
    with pytest.raises(FileNotFoundError):
        fs.copy_to_local(str(tmp_path / "missing"), str(tmp_path / "never"))
    assert sorted(os.listdir(tmp_path)) == ["copy", "src", "uploaded", "z.txt"]  # no leftovers


def test_a_url_goes_to_gcsfs_at_the_emulator_when_one_is_set(monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    with fs._on("gs://b/run/", check=False) as (filesystem, name):  # noqa: SLF001
        assert type(filesystem).__name__ == "GCSFileSystem" and name == "b/run"
        assert filesystem._location == "http://127.0.0.1:9"  # noqa: SLF001
    with fs._on("/tmp/x/") as (filesystem, name):  # noqa: SLF001
        assert type(filesystem).__name__ == "LocalFileSystem" and name == "/tmp/x"


def test_every_gcsfs_client_lists_the_bucket_afresh():
    """Orbax's gcsfs (etils.epath asks fsspec for one) keeps no listing either: a remembered
    listing of a step set aside made its next save of that step fail (test_gcs shows it)."""
    import fsspec

    orbax_like = fsspec.filesystem("gcs", token="anon", finalize_on_close=True)
    assert orbax_like.dircache.use_listings_cache is False


def test_a_failed_copy_of_one_file_leaves_nothing_behind(tmp_path, monkeypatch):
    source = tmp_path / "one.txt"
    source.write_text("x")

    def refuse(*_):
        raise OSError("rename refused")

    monkeypatch.setattr(fs.os, "rename", refuse)
    with pytest.raises(OSError, match="rename refused"):
        fs.copy_to_local(str(source), str(tmp_path / "copy.txt"))
    assert sorted(os.listdir(tmp_path)) == ["one.txt"]  # no hidden temporary file left


def test_a_bucket_rename_is_whole_or_absent(monkeypatch):
    """A copy that fails midway takes back the copies made; the source stays whole. (fsspec's
    memory file system stands in for the bucket; make test-gcs renames in the emulator.)"""
    memory = fsspec.filesystem("memory")

    @contextlib.contextmanager
    def on(path, check=True):
        yield memory, "/" + os.fspath(path)[len(fs.SCHEME) :]

    monkeypatch.setattr(fs, "_on", on)
    for name in ("a", "b", "c"):
        memory.pipe_file(f"/bkt/step/{name}", name.encode())
    copy_file, copied = memory.cp_file, []

    def fails_third(source, target, **kwargs):
        if len(copied) == 2:
            raise OSError("503 Service Unavailable")
        copy_file(source, target, **kwargs)
        copied.append(target)

    monkeypatch.setattr(memory, "cp_file", fails_third)
    try:
        with pytest.raises(OSError, match="503"):
            fs.rename("gs://bkt/step", "gs://bkt/aside")
        assert memory.find("/bkt/aside") == [] and len(copied) == 2
        assert memory.find("/bkt/step") == ["/bkt/step/a", "/bkt/step/b", "/bkt/step/c"]
        monkeypatch.setattr(memory, "cp_file", copy_file)
        fs.rename("gs://bkt/step", "gs://bkt/aside")
        assert memory.find("/bkt/step") == [] and memory.cat_file("/bkt/aside/c") == b"c"
    finally:
        memory.rm("/bkt", recursive=True)
