"""Where bulk jobs keep their files: the uploaded manifest, result segments, the output files.

One small interface, ``BlobStore``; ``DirectoryStore`` keeps the files in a local or mounted
directory (a PersistentVolume in the chart). Every write is atomic (a temporary file renamed into
place), so a reader never sees half a file and a writer killed mid-write leaves nothing under the
name. Blocking file work runs in threads: the event loop serves requests meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import BinaryIO, Protocol

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

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
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
            while chunk := await asyncio.to_thread(handle.read, READ_CHUNK):
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
