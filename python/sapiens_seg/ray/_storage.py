"""Where the driver and the actors read and write: local paths and pyarrow file systems (URIs),
and files written whole."""

from __future__ import annotations

import os
import posixpath
import uuid

import pyarrow.fs as pafs


def _is_uri(s: str) -> bool:
    head, sep, _ = s.partition("://")
    return bool(sep) and head.isalnum() and len(head) > 1


def _absolute(location: str) -> str:
    location = os.fspath(location)
    return location if _is_uri(location) else os.path.abspath(location)


def _resolve(location: str,
             filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, path on it, prefix that turns such a path back into the URI)."""
    if filesystem is not None:
        return filesystem, location.rstrip("/") or location, ""
    if _is_uri(location):
        uri = location.rstrip("/")
        fs, path = pafs.FileSystem.from_uri(uri)
        if isinstance(fs, pafs.LocalFileSystem):  # file:///...
            return fs, path, ""
        prefix = uri[:len(uri) - len(path)] if uri.endswith(path) else uri.split("://")[0] + "://"
        return fs, path, prefix
    return pafs.LocalFileSystem(), os.path.abspath(location), ""


def _write_file(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    parent = posixpath.dirname(path)
    if isinstance(fs, pafs.LocalFileSystem):
        os.makedirs(parent, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return
    if parent:
        try:
            fs.create_dir(parent, recursive=True)
        except OSError:
            pass  # object stores have no folders; a real error shows at the write below
    with fs.open_output_stream(path) as f:  # an object appears whole when the stream closes
        f.write(data)
