"""Where the driver and the actors read and write: local paths and pyarrow file systems (URIs),
and files written whole.

A local file is written as the CLI writes one (docs/cli-outputs.md): to a temporary name in the
same folder, ``<file>.tmp-<host>-<pid>-<8 hex digits>``, flushed to disk (fsync), then renamed;
any failed write, flush or close (a full disk, a file size limit: Python ignores SIGXFSZ, so it
is an EFBIG error) removes the temporary file and raises OSError, which the actor records as
that row's ``io_error``. The temporary files of a process that died (an actor killed with
SIGKILL, out of memory) are removed by the next write into that folder from the same host, once
that process is gone. An object store (S3, GCS) shows an object only once its upload completes.
"""

from __future__ import annotations

import os
import posixpath
import re
import socket
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


_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"
_TEMP = re.compile(r"^.+\.tmp-(?P<host>[A-Za-z0-9._]+)-(?P<pid>\d+)-[0-9a-f]{8}$")
_swept: set[str] = set()  # folders already cleared of dead processes' temporary files


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_temps(folder: str) -> int:
    """Removes the temporary files that processes of this host which are gone left in `folder`
    (a process killed in the middle of a write); returns how many."""
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        m = _TEMP.match(name)
        if m is None or m["host"] != _HOST or _pid_alive(int(m["pid"])):
            continue
        try:
            os.unlink(os.path.join(folder, name))
            removed += 1
        except OSError:
            pass
    return removed


def _write_local(path: str, data: bytes) -> None:
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    if parent not in _swept:
        _swept.add(parent)
        _remove_stale_temps(parent)
    tmp = f"{path}.tmp-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)  # raises on ENOSPC, EFBIG, EIO
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)  # NFS reports some write errors only here: raised too
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_file(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    if isinstance(fs, pafs.LocalFileSystem):
        _write_local(path, data)
        return
    parent = posixpath.dirname(path)
    if parent:
        try:
            fs.create_dir(parent, recursive=True)
        except OSError:
            pass  # object stores have no folders; a real error shows at the write below
    with fs.open_output_stream(path) as f:  # an object appears whole when the stream closes
        f.write(data)
