"""Files on local disk or in a bucket (`gs://...`) through one code path.

A run's MODEL_DIR, a TFDS data_dir, evaluation outputs and reports may live on Cloud Storage
(the TPU VM workers share nothing else). Every small file this codebase writes or reads beside
the checkpoints goes through `_tf().io.gfile`, which serves local paths, `gs://` and TensorFlow's
other filesystems (`ram://` is what the tests use) alike. Orbax, TensorBoard and TFDS handle
`gs://` themselves and are handed the path unchanged; `os.path.join` builds paths (POSIX
'/'-joining suits URLs too).
"""

from __future__ import annotations

import functools
import os
import zlib
from typing import Any


@functools.cache
def _tf() -> Any:
    """TensorFlow, imported on first file access: the import costs ~0.9 GB of host memory and
    seconds, which a process that never touches a file here (a benchmark's step, a test of the
    model) should not pay."""
    import tensorflow as tf

    return tf


def __getattr__(name: str) -> Any:
    if name == "ERRORS":  # what a failed file operation raises: OSError, or tf.errors.* via gfile
        return (OSError, _tf().errors.OpError)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_remote(path: str) -> bool:
    """A URL-style path (`gs://bucket/dir`, `ram://dir`) rather than a local file name."""
    return "://" in path


def resolve(path: str) -> str:
    """Local paths become absolute (`~` expanded), as orbax requires; remote ones are kept
    exactly (`os.path.abspath` would turn `gs://b/x` into `/cwd/gs:/b/x`)."""
    return path if is_remote(path) else os.path.abspath(os.path.expanduser(path))


def exists(path: str) -> bool:
    return _tf().io.gfile.exists(path)


def isdir(path: str) -> bool:
    return _tf().io.gfile.isdir(path)


def makedirs(path: str) -> None:
    _tf().io.gfile.makedirs(path)


def remove(path: str) -> None:
    _tf().io.gfile.remove(path)


def remove_tree(path: str) -> None:
    _tf().io.gfile.rmtree(path)


def tensorflow() -> Any:
    """TensorFlow itself, for readers that take a path straight to TF (`tf.train.load_checkpoint`
    reads a TF1 checkpoint from disk or a bucket alike)."""
    return _tf()


def read_bytes(path: str) -> bytes:
    with _tf().io.gfile.GFile(path, "rb") as f:
        return f.read()


def copy_file(source: str, destination: str) -> None:
    """Copy one file (local or remote, either side), creating the destination's directory."""
    directory = os.path.dirname(destination)
    if directory:
        makedirs(directory)
    _tf().io.gfile.copy(source, destination, overwrite=True)


def read_text(path: str) -> str:
    with _tf().io.gfile.GFile(path, "r") as f:
        return f.read()


def write_text(path: str, text: str) -> None:
    """Write `text` to `path`, creating its directory. The text goes to a temporary name that is
    then renamed over `path`, so a reader (or a run killed mid-write) never sees half a file."""
    directory = os.path.dirname(path)
    if directory:
        makedirs(directory)
    tmp = f"{path}.tmp-{os.getpid()}"
    with _tf().io.gfile.GFile(tmp, "w") as f:
        f.write(text)
    _tf().io.gfile.rename(tmp, path, overwrite=True)


def write_bytes(path: str, data: bytes) -> None:
    directory = os.path.dirname(path)
    if directory:
        makedirs(directory)
    with _tf().io.gfile.GFile(path, "wb") as f:
        f.write(data)


def copy_tree(source: str, destination: str) -> None:
    """Copy a directory tree (e.g. a profiler trace written locally) to `destination`."""
    for directory, _, files in _tf().io.gfile.walk(source):
        relative = os.path.relpath(directory, source)
        target = destination if relative == "." else os.path.join(destination, relative)
        makedirs(target)
        for name in files:
            _tf().io.gfile.copy(
                os.path.join(directory, name), os.path.join(target, name), overwrite=True
            )


def file_sizes(root: str) -> dict[str, int]:
    """{path relative to `root`: size in bytes} of every file under `root`."""
    sizes = {}
    for directory, _, files in _tf().io.gfile.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            sizes[os.path.relpath(path, root)] = _tf().io.gfile.stat(path).length
    return sizes


def file_crc32(path: str, chunk_bytes: int = 16 << 20) -> int:
    """CRC-32 of a file's bytes, read in chunks (checkpoint files can be gigabytes)."""
    crc = 0
    with _tf().io.gfile.GFile(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            crc = zlib.crc32(chunk, crc)
    return crc


def file_digests(root: str) -> dict[str, dict[str, int]]:
    """{path relative to `root`: {"size", "crc32"}} of every file under `root`: what a later
    reader compares to tell a damaged file (same size, other bytes) from the one written."""
    return {
        name: {"size": size, "crc32": file_crc32(os.path.join(root, name))}
        for name, size in file_sizes(root).items()
    }


def free_bytes(path: str) -> int | None:
    """Free space on the local disk holding `path` (its nearest existing parent), or None
    for a bucket (no such limit to report)."""
    if is_remote(path):
        return None
    import shutil

    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path or "/").free


def listdir(path: str) -> list[str]:
    return _tf().io.gfile.listdir(path) if _tf().io.gfile.isdir(path) else []
