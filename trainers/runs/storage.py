"""Where a run reads and writes: a local path, or a URL of an object store through fsspec.

:func:`location` turns what a user passed (``--output-dir``, ``--resume``, ``--data``,
``--tokenizer``, a run given to ``trainers.tools.sample``) into a path object: a ``pathlib.Path``
for a local path (behaving exactly as before URLs existed), a ``upath.UPath`` for ``s3://``,
``gs://``, ``az://`` and the other fsspec schemes. Both offer the pathlib methods the trainers use
(``/``, ``exists``, ``is_dir``, ``iterdir``, ``glob``, ``open``, ``read_text``, ``stat``); what
pathlib cannot do on an object store (remove a tree, write a file atomically, hash what was written,
check a bucket) is here. Credentials and the endpoint come from the store's own environment
(``AWS_*``, ``AWS_ENDPOINT_URL``); nothing here records them. Plain Python without torch, so
components check a URL before anything is scheduled.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from trainers.errors import ConfigError

if TYPE_CHECKING:
    from upath import UPath

# A run's path: local, or on an object store.
RunPath = Union[Path, "UPath"]

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
# The package each object-store scheme needs, and the extra of this project that installs it.
_PACKAGES = {"s3": ("s3fs", "s3"), "s3a": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"),
             "gcs": ("gcsfs", "gcs"), "az": ("adlfs", "azure"), "abfs": ("adlfs", "azure"),
             "abfss": ("adlfs", "azure")}
# Schemes that are not storage a run can live on (fsspec knows them, but they are read-only
# or process-local).
_NOT_STORAGE = frozenset({"http", "https", "memory", "zip", "tar", "github", "git", "ftp",
                          "sftp", "ssh", "hdfs", "webhdfs", "dbfs", "hf", "reference",
                          "cached", "simplecache", "filecache", "blockcache", "data"})


def scheme(name: str | os.PathLike[str]) -> str | None:
    """The URL scheme of ``name`` (``s3`` of ``s3://b/x``), None for a local path."""
    match = _URL.match(str(name))
    return match.group(1).lower() if match else None


def is_url(name: str | os.PathLike[str]) -> bool:
    """Whether ``name`` is a URL of an object store (``file://`` is a local path)."""
    return scheme(name) not in (None, "file")


def is_remote(path: RunPath) -> bool:
    """Whether ``path`` (from :func:`location`) lives on an object store."""
    return not isinstance(path, Path)


def location(name: str | os.PathLike[str], flag: str = "") -> RunPath:
    """The path object for ``name``: ``pathlib.Path`` when local, ``UPath`` for a URL.

    ConfigError (one line, naming ``flag``) for a scheme that is not storage, or whose fsspec
    implementation is not installed (naming the extra that installs it). Reaches no server."""
    named = f"{flag} {name}" if flag else str(name)
    found = scheme(name)
    if found is None:
        return Path(name)
    if found == "file":
        return Path(str(name)[len("file://"):])
    from fsspec.registry import known_implementations

    if found in _NOT_STORAGE or (found not in known_implementations and found not in _PACKAGES):
        raise ConfigError(f"{named}: unknown storage scheme {found}://; pass a local path or "
                          "an s3:// (gs://, az://) URL")
    package, extra = _PACKAGES.get(found, (found, found))
    try:
        from fsspec import get_filesystem_class

        get_filesystem_class(found)
    except ImportError:
        raise ConfigError(f"{named}: {found}:// needs the {package} package; pip install "
                          f"-e '.[{extra}]'") from None
    from upath import UPath

    # Listings are read fresh: other ranks and attempts write under the same prefix.
    return UPath(str(name), use_listings_cache=False)


def remove(path: RunPath) -> None:
    """Delete ``path`` and everything under it, if anything is there."""
    if not is_remote(path):
        shutil.rmtree(path, ignore_errors=True)
        if path.is_file():
            path.unlink()
        return
    with contextlib.suppress(FileNotFoundError):
        path.fs.rm(path.path, recursive=True)


def write_bytes_atomic(path: RunPath, data: bytes) -> None:
    """Write ``data`` as file ``path`` so that a reader sees the old file or the whole new one,
    never part: on disk through a scratch file, ``fsync`` and rename; on an object store one PUT
    (objects appear whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_remote(path):
        path.write_bytes(data)
        return
    tmp = path.with_name(f"{path.name}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def crc32(path: RunPath) -> int:
    """The CRC-32 of file ``path``'s contents."""
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def listing(folder: RunPath) -> dict[str, tuple[int, Any]]:
    """Every file directly in ``folder``: name -> (size, checksum). On disk the checksum is
    the CRC-32 of the contents (read here); on an object store the store's own content hash
    from one listing (S3: the ETag), so nothing is downloaded."""
    if not is_remote(folder):
        return {p.name: (p.stat().st_size, crc32(p))
                for p in sorted(folder.iterdir()) if p.is_file()}
    entries = folder.fs.ls(folder.path, detail=True)
    files = {}
    for entry in entries:
        if entry["type"] == "file":
            files[entry["name"].rsplit("/", 1)[-1]] = (int(entry["size"]), _store_hash(entry))
    return dict(sorted(files.items()))


def _store_hash(entry: dict[str, Any]) -> str:
    """The content hash an object store reports for an object (S3's ETag, GCS's md5Hash or
    crc32c, Azure's content_md5 or etag)."""
    for key in ("ETag", "etag", "md5Hash", "crc32c", "content_md5"):
        value = entry.get(key)
        if value:
            return str(value).strip('"')
    raise ConfigError(f"{entry['name']}: the object store reports no content hash for it")


def _probe_client(url: RunPath) -> Any:
    """The file system that checks ``url``'s store: for S3 a client of its own that gives up
    after two attempts and 5 s per connection (the run's own client keeps the default retries,
    which spend half a minute on an endpoint that is down)."""
    if url.protocol in ("s3", "s3a"):
        import fsspec

        return fsspec.filesystem("s3", skip_instance_cache=True, config_kwargs={
            "connect_timeout": 5, "read_timeout": 30,
            "retries": {"max_attempts": 2, "mode": "standard"}})
    return url.fs


def _bucket_exists(fs: Any, bucket: str) -> bool:
    """Whether ``bucket`` exists; a client error (credentials, endpoint) raises."""
    if hasattr(fs, "call_s3"):
        try:
            fs.call_s3("head_bucket", Bucket=bucket)
        except FileNotFoundError:
            return False
        return True
    return fs.exists(bucket)


def store_reason(url: RunPath, write: bool) -> str | None:
    """Why the object store at ``url`` cannot be read (or, with ``write``, written), in a few
    words naming the fix; None when it can. Writing is checked with one empty object that is
    removed again. Reaches the server: for a submit or a start, never for a dry run."""
    fs = _probe_client(url)
    bucket = url.path.split("/", 1)[0]
    try:
        if not _bucket_exists(fs, bucket):
            return f"bucket {bucket} does not exist (create it, or fix the URL)"
        if write:
            probe = f"{url.path.rstrip('/')}/.write-check-{uuid.uuid4().hex}"
            fs.pipe_file(probe, b"")
            fs.rm_file(probe)
    except Exception as err:  # noqa: BLE001 - each store's client raises its own kinds
        return _store_error(err)
    return None


def _store_error(err: BaseException) -> str:
    """A few words for an object store client's error, naming the fix."""
    text = f"{type(err).__name__}: {err}"
    if "NoCredentials" in text or "Unable to locate credentials" in text:
        return ("no credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "AWS_PROFILE, or a role)")
    if "EndpointConnectionError" in text or "Could not connect" in text \
            or "ConnectTimeout" in text or "Connection refused" in text:
        return ("the endpoint is unreachable (check AWS_ENDPOINT_URL and the network: "
                f"{os.environ.get('AWS_ENDPOINT_URL', 'AWS default')})")
    if "AccessDenied" in text or "Forbidden" in text or isinstance(err, PermissionError):
        return "access denied (grant the credentials read and write on the bucket)"
    if "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text:
        return "the credentials are not valid here (check AWS_ACCESS_KEY_ID and the secret)"
    last = str(err).strip().splitlines()
    return last[-1] if last else type(err).__name__


def check_store(url: RunPath, flag: str, write: bool) -> None:
    """ConfigError (one line naming ``flag``) when :func:`store_reason` finds a problem; a local
    ``url`` passes (its checks are :mod:`trainers.options.paths`')."""
    if not is_remote(url):
        return
    reason = store_reason(url, write)
    if reason is not None:
        raise ConfigError(f"{flag} {url}: {reason}")
