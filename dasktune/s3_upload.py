"""Streaming uploads to S3 with bounded memory, and the transfer settings.

A checkpoint's files go to S3 in parallel, each streamed from disk: a file up to
``inline-size`` in one request from memory, a larger one as a single PUT (up to
``s3-part-size``) or a multipart upload with parallel parts, at most ``requests``
requests in flight across all files, and the object's size checked before the
manifest counts it. The requests go through :class:`_S3Requests`, the one adapter to
s3fs's private request call (its docstring says why). Settings: ``dasktune.storage.
transfer`` in dasktune.yaml.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sys
from typing import Any

from dasktune import _dask_config

__all__ = ["is_s3", "s3_put", "transfer_setting"]


def transfer_setting(key: str) -> int:
    """A ``dasktune.storage.transfer`` setting (see dasktune.yaml): a count or a size."""
    from dask.utils import parse_bytes

    value = _dask_config.get(f"storage.transfer.{key}")
    return int(parse_bytes(value) if isinstance(value, str) else value)


def is_s3(fs: Any) -> bool:
    """Whether ``fs`` is s3fs's, whose uploads :func:`s3_put` drives itself."""
    s3fs = sys.modules.get("s3fs")  # loaded if fs is one: no import for other stores
    return s3fs is not None and isinstance(fs, s3fs.S3FileSystem)


class _FileRange(io.RawIOBase):
    """Bytes ``[start, start + length)`` of a local file, read from disk as asked.

    The body of one S3 request: botocore reads it in 1 MiB pieces for its checksum and
    aiohttp in 256 KiB pieces to send it, so memory does not grow with the part size.
    It has no ``fileno``, so aiohttp takes the length from the request's header.
    """

    def __init__(self, path: str, start: int, length: int):
        super().__init__()
        self._fd = os.open(path, os.O_RDONLY)
        self._start = start
        self._len = length
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._len}[whence]
        self._pos = max(0, min(self._len, base + offset))
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        left = self._len - self._pos
        n = left if size is None or size < 0 else min(size, left)
        if n <= 0:
            return b""
        data = os.pread(self._fd, n, self._start + self._pos)
        self._pos += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


async def _first_error(coros: list[Any]) -> list[Any]:
    """Run ``coros`` concurrently; on the first error cancel the rest, then raise it
    (a plain ``gather`` would leave them uploading behind a retry)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    if not tasks:
        return []
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]
    return [t.result() for t in tasks]


class _S3Requests:
    """The one place dasktune reaches into s3fs's private API: ``S3FileSystem._call_s3``,
    one botocore request with s3fs's session, credentials, endpoint and retries.

    Why not s3fs's public ``put``/``put_file``: it reads every part whole into memory
    (``chunksize`` x ``max_concurrency`` per file, ``batch_size`` files at once) and sends
    large files far slower than these streamed requests. ``python benchmarks/storage.py
    --s3-paths`` on moto over HTTP (2026-12-06, 2 shared cores): 64 MiB x 2, 43.1 vs
    15.7 MiB/s and +3 vs +129 MiB RSS; 1 MiB x 100, 26.1 vs 24.5 MiB/s. Downloads use
    s3fs's public ``get`` (one streaming GET per file: 98.3 vs 81.8 MiB/s at 64 MiB x 2,
    23.9 vs 31.3 MiB/s at 1 MiB x 100, no RSS growth either way).
    """

    def __init__(self, fs: Any):
        self._call = fs._call_s3

    async def __call__(self, method: str, **kwargs: Any) -> Any:
        return await self._call(method, **kwargs)


async def _s3_put_async(fs: Any, lpaths: list[str], rpaths: list[str],
                        sizes: list[int]) -> None:
    """Upload files to S3 in parallel, streaming each from disk (see :func:`s3_put`)."""
    call_s3 = _S3Requests(fs)
    limit = asyncio.Semaphore(max(1, transfer_setting("requests")))
    inline = transfer_setting("inline-size")
    part_size = max(5 * 2**20, transfer_setting("s3-part-size"))  # S3's smallest part

    async def send(method: str, lpath: str, start: int, length: int, **kw: Any) -> Any:
        async with limit:
            if length <= inline:  # small: one read, a body botocore can resend
                with open(lpath, "rb") as f:
                    f.seek(start)
                    return await call_s3(method, Body=f.read(length), **kw)
            with _FileRange(lpath, start, length) as body:
                # ContentLength explicit: a body a failed try half-read can never pass
                # for a shorter, complete object (the size check below is the proof).
                return await call_s3(method, Body=body, ContentLength=length, **kw)

    async def one(lpath: str, rpath: str, size: int) -> None:
        bucket, key, _ = fs.split_path(rpath)
        if size <= part_size:
            await send("put_object", lpath, 0, size, Bucket=bucket, Key=key)
        else:
            async with limit:
                mpu = await call_s3("create_multipart_upload", Bucket=bucket, Key=key)
            upload_id = mpu["UploadId"]

            async def part(number: int, start: int) -> dict[str, Any]:
                out = await send("upload_part", lpath, start, min(part_size, size - start),
                                 Bucket=bucket, Key=key, UploadId=upload_id,
                                 PartNumber=number)
                return {"PartNumber": number, "ETag": out["ETag"]}

            try:
                parts = await _first_error([part(i + 1, start) for i, start
                                            in enumerate(range(0, size, part_size))])
                async with limit:
                    await call_s3("complete_multipart_upload", Bucket=bucket, Key=key,
                                      UploadId=upload_id, MultipartUpload={"Parts": parts})
            except BaseException:
                with contextlib.suppress(Exception):  # best effort: S3 expires it anyway
                    await call_s3("abort_multipart_upload", Bucket=bucket, Key=key,
                                      UploadId=upload_id)
                raise
        if size > inline:
            # s3fs's own retries resend a streamed body from where the failed try left
            # it: prove the object is whole before the manifest says so.
            async with limit:
                head = await call_s3("head_object", Bucket=bucket, Key=key)
            if head.get("ContentLength") != size:
                raise OSError(f"short upload of {rpath}: {head.get('ContentLength')} of "
                              f"{size} bytes")

    await _first_error([one(lp, rp, n) for lp, rp, n in zip(lpaths, rpaths, sizes)])


def s3_put(fs: Any, lpaths: list[str], rpaths: list[str], sizes: list[int]) -> None:
    """Upload local files to S3 with memory bounded whatever their size, in parallel.

    s3fs's ``put`` reads every part (50 MiB by default) whole into memory, for each of
    the files and parts in flight; here a file over ``inline-size`` is sent straight
    from disk (single PUT up to ``s3-part-size``, then multipart with parallel parts),
    at most ``requests`` requests at a time across all files.
    """
    from fsspec.asyn import sync

    try:
        sync(fs.loop, _s3_put_async, fs, lpaths, rpaths, sizes)
    finally:
        for rpath in rpaths:  # listings cached before the upload are stale now
            fs.invalidate_cache(rpath)
