"""Where bulk jobs keep their files: the uploaded manifest, result segments, the output files.

One small interface, ``BlobStore``; ``DirectoryStore`` keeps the files in a local or mounted
directory (a PersistentVolume in the chart), ``ObjectStore`` in an S3-compatible bucket. Every
write is atomic (a temporary file renamed into place; a multipart upload completed at once), so
a reader never sees half a file and a writer killed mid-write leaves nothing under the name.
Blocking file work runs in threads: the event loop serves requests meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

import obstore
from obstore.store import S3Store

from ferry.errors import ConfigError

READ_CHUNK = 256 * 1024


class BlobWriter(Protocol):
    """A file being written: visible under its name only once ``commit`` returns."""

    async def write(self, data: bytes) -> None: ...

    async def commit(self) -> None: ...

    async def abort(self) -> None: ...


class BlobStore(Protocol):
    """Named files (``jobs/<id>/input.jsonl``); names are '/'-separated and relative."""

    def writer(self, name: str) -> BlobWriter: ...

    async def put(self, name: str, data: bytes) -> None: ...

    async def lines(self, name: str, offset: int, count: int) -> list[tuple[int, bytes]]:
        """Up to ``count`` lines (newline stripped) from byte ``offset``, each with the offset
        of the line after it."""
        ...

    def stream(self, name: str) -> AsyncIterator[bytes]:
        """The file's bytes in chunks; FileNotFoundError if there is none."""
        ...

    async def exists(self, name: str) -> bool: ...

    async def delete(self, names: Iterable[str]) -> None: ...

    async def names(self, prefix: str) -> list[str]: ...


class DirectoryStore:
    """Files under a directory (created when missing)."""

    def __init__(self, root: str | Path, read_chunk: int = READ_CHUNK) -> None:
        self.root = Path(root).resolve()
        self.read_chunk = read_chunk  # bytes per read of a stream
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"job_store_dir {str(root)!r} cannot be created: {exc}") from None

    def path(self, name: str) -> Path:
        path = (self.root / name).resolve()
        if self.root not in path.parents:
            raise ValueError(f"blob name {name!r} leaves the store")
        return path

    def writer(self, name: str) -> DirectoryWriter:
        return DirectoryWriter(self.path(name))

    async def put(self, name: str, data: bytes) -> None:
        writer = self.writer(name)
        try:
            await writer.write(data)
            await writer.commit()
        except BaseException:
            await writer.abort()
            raise

    async def lines(self, name: str, offset: int, count: int) -> list[tuple[int, bytes]]:
        return await asyncio.to_thread(_read_lines, self.path(name), offset, count)

    async def stream(self, name: str) -> AsyncIterator[bytes]:
        handle = await asyncio.to_thread(self.path(name).open, "rb")
        try:
            while chunk := await asyncio.to_thread(handle.read, self.read_chunk):
                yield chunk
        finally:
            handle.close()

    async def exists(self, name: str) -> bool:
        return await asyncio.to_thread(self.path(name).is_file)

    async def delete(self, names: Iterable[str]) -> None:
        paths = [self.path(name) for name in names]
        await asyncio.to_thread(_unlink_all, paths)

    async def names(self, prefix: str) -> list[str]:
        folder = self.path(prefix) if prefix else self.root
        return await asyncio.to_thread(self._names, folder)

    def _names(self, folder: Path) -> list[str]:
        if not folder.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in folder.rglob("*")
                      if p.is_file() and not p.name.startswith(".tmp-"))

    async def remove_tree(self, prefix: str) -> None:
        await asyncio.to_thread(shutil.rmtree, self.path(prefix), True)


class DirectoryWriter:
    """A temporary file beside the target, renamed onto it by ``commit`` (after an fsync)."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.temp = target.with_name(f".tmp-{target.name}-{secrets.token_hex(4)}")
        self._handle: BinaryIO | None = None

    async def write(self, data: bytes) -> None:
        if self._handle is None:
            self._handle = await asyncio.to_thread(self._open)
        await asyncio.to_thread(self._handle.write, data)

    def _open(self) -> BinaryIO:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        return self.temp.open("wb")

    async def commit(self) -> None:
        if self._handle is None:
            self._handle = await asyncio.to_thread(self._open)
        await asyncio.to_thread(self._finish)

    def _finish(self) -> None:
        assert self._handle is not None
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        os.replace(self.temp, self.target)

    async def abort(self) -> None:
        if self._handle is not None:
            self._handle.close()
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(self.temp.unlink)


def _read_lines(path: Path, offset: int, count: int) -> list[tuple[int, bytes]]:
    found: list[tuple[int, bytes]] = []
    with path.open("rb") as handle:
        handle.seek(offset)
        while len(found) < count:
            line = handle.readline()
            if not line:
                break
            offset += len(line)
            found.append((offset, line.rstrip(b"\r\n")))
    return found


def _unlink_all(paths: Iterable[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


class ObjectStore:
    """Files as objects of an S3-compatible store (``s3://bucket/prefix``), through obstore.

    Credentials and the region come from the usual ``AWS_*`` variables (or the pod's role);
    ``endpoint`` names a store other than AWS's (MinIO, Ceph, a loopback test server). An
    object appears whole when its writer commits (a multipart upload completes at once), never
    half-written.
    """

    def __init__(self, url: str, endpoint: str = "", keys: S3Keys | None = None,
                 read_chunk: int = READ_CHUNK) -> None:
        self.store = s3_store(url, endpoint, keys)
        self.read_chunk = read_chunk  # bytes per ranged read (doubled for a longer line)

    def writer(self, name: str) -> ObjectWriter:
        return ObjectWriter(self.store, name)

    async def put(self, name: str, data: bytes) -> None:
        await obstore.put_async(self.store, name, data)

    async def lines(self, name: str, offset: int, count: int) -> list[tuple[int, bytes]]:
        size = int((await obstore.head_async(self.store, name))["size"])
        found: list[tuple[int, bytes]] = []
        window = self.read_chunk
        while len(found) < count and offset < size:
            end = min(size, offset + window)
            data = bytes(await obstore.get_range_async(self.store, name, start=offset, end=end))
            whole = data.split(b"\n")
            if end < size or not whole[-1]:
                whole.pop()  # cut off by the window (read again from it), or past the last
            if not whole:  # one line longer than the window
                window *= 2
                continue
            for line in whole[:count - len(found)]:
                offset += len(line) + 1
                found.append((min(offset, size), line.rstrip(b"\r")))
        return found

    async def stream(self, name: str) -> AsyncIterator[bytes]:
        result = await obstore.get_async(self.store, name)
        async for chunk in result.stream(min_chunk_size=self.read_chunk):
            yield bytes(chunk)

    async def exists(self, name: str) -> bool:
        try:
            await obstore.head_async(self.store, name)
        except FileNotFoundError:
            return False
        return True

    async def delete(self, names: Iterable[str]) -> None:
        listed = list(names)
        if listed:
            await obstore.delete_async(self.store, listed)

    async def names(self, prefix: str) -> list[str]:
        found: list[str] = []
        async for page in obstore.list(self.store, prefix or None):
            found.extend(str(meta["path"]) for meta in page)
        return sorted(found)


class ObjectWriter:
    """An object written as it comes (multipart); it exists once ``commit`` returns."""

    def __init__(self, store: S3Store, name: str) -> None:
        self.store = store
        self.name = name
        self._file: obstore.AsyncWritableFile | None = None

    async def write(self, data: bytes) -> None:
        if self._file is None:
            self._file = obstore.open_writer_async(self.store, self.name)
        await self._file.write(data)

    async def commit(self) -> None:
        if self._file is None:
            await obstore.put_async(self.store, self.name, b"")
            return
        await self._file.close()

    async def abort(self) -> None:
        self._file = None  # never completed: the upload is not an object (S3 expires its parts)


@dataclass(frozen=True)
class S3Keys:
    """Static S3 credentials (else obstore's own: AWS_* variables, the pod's identity)."""

    access_key_id: str
    secret_access_key: str


def s3_store(url: str, endpoint: str = "", keys: S3Keys | None = None) -> S3Store:
    """An obstore S3 client of ``s3://bucket[/prefix]``; over plain HTTP when ``endpoint`` is
    an http:// URL (a store on loopback)."""
    config: dict[str, str] = {"endpoint": endpoint} if endpoint else {}
    if keys is not None:
        config |= {"access_key_id": keys.access_key_id,
                   "secret_access_key": keys.secret_access_key}
    options: dict[str, bool] = {"allow_http": True} if endpoint.startswith("http://") else {}
    return S3Store.from_url(url, config=config or None,  # type: ignore[arg-type]
                            client_options=options or None)  # type: ignore[arg-type]


def blob_store(location: str, endpoint: str = "", keys: S3Keys | None = None) -> BlobStore:
    """The job store at ``location``: ``s3://bucket/prefix`` or a directory."""
    if location.startswith("s3://"):
        return ObjectStore(location, endpoint, keys)
    return DirectoryStore(location.removeprefix("file://"))
