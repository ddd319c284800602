"""A light read-only S3-compatible server, for measuring clients rather than servers.

moto answers a few hundred requests a second on a busy 2-core host (one
Python process parsing XML and checking signatures), and the latency proxy in
front of it is a second hop: at 20 ms per request the server, not the
latency, then sets the pace of a 1024-object read, and a client that uses
less CPU leaves more of it to moto. `StaticS3Server` takes both out of the
measurement: one asyncio process (stdlib only) serving the files under a
directory laid out as ``<root>/<bucket>/<key>``:

- GET (whole, or one ``Range``: ``bytes=a-b``, ``bytes=a-``, ``bytes=-n`` as
  zarr asks for shard indexes; 206 with ``Content-Range``) and HEAD, with the
  headers the S3 clients read: ``Content-Length``, ``Content-Type``, a
  quoted ``ETag`` (obstore's ``object_store`` and tensorstore require one),
  ``Last-Modified`` (required by ``object_store``) and ``Accept-Ranges``;
- a missing key: 404 with an S3 ``NoSuchKey`` XML body (botocore reads the
  code from it; obstore and tensorstore go by the status), body-less on HEAD;
- signatures and query strings are ignored; nothing can be written;
- the latency is added by the server itself (``asyncio.sleep`` before each
  response, concurrently across connections), and requests and bytes are
  counted as the proxy counts them (`helpers.s3.Stats`).

Connections are kept alive (HTTP/1.1). File contents are cached by path,
size and mtime, so a request costs a ``stat`` and a write. The handle talks
to the process over the proxy's control requests; the process exits when its
stdin closes.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import http
import json
import os
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

try:
    from .s3 import CONTROL, HOST, IO_TIMEOUT, ChildServer, Request, Stats, serve_until_stdin_closes
except ImportError:  # run as a script: the server's own process
    from s3 import (  # type: ignore[no-redef]
        CONTROL,
        HOST,
        IO_TIMEOUT,
        ChildServer,
        Request,
        Stats,
        serve_until_stdin_closes,
    )

_MISSING = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    "<Message>{message}</Message><Key>{key}</Key><RequestId>0</RequestId></Error>"
)


class StaticS3Server(ChildServer):
    """The handle on a `_StaticServer` process serving ``root`` on 127.0.0.1.

    ``cpu``: pin the server process to this CPU (``os.sched_setaffinity``),
    to keep it off the CPU a client under measurement is pinned to.
    `reset` returns the counters since the last reset and sets the latency;
    `cpu_seconds` is the server process' CPU time so far (user + system).
    """

    name = "the static S3 server"

    def __init__(self, root: Path, latency: float = 0.0, cpu: int | None = None) -> None:
        super().__init__(latency)
        self.root = Path(root).resolve()
        self.cpu = cpu

    def _argv(self) -> list[str]:
        return [sys.executable, __file__, str(self.root), str(self.latency), str(self.cpu)]

    @property
    def cpu_seconds(self) -> float:
        return float(self._control("stats")["cpu_s"])


# -- the server's process -----------------------------------------------------------------


def parse_range(value: str, size: int) -> tuple[int, int] | None:
    """``(start, stop)`` of one ``bytes=`` range within ``size`` bytes, or
    None when it cannot be served (416)."""
    unit, _, spec = value.strip().partition("=")
    first, dash, last = spec.partition("-")
    if unit != "bytes" or not dash or "," in spec or not (first or last):
        return None
    try:
        if not first:  # the last n bytes
            start, stop = max(0, size - int(last)), size
        else:
            start = int(first)
            stop = size if not last else min(size, int(last) + 1)
    except ValueError:
        return None
    if start >= size or start >= stop:
        return None
    return start, stop


class _StaticServer:
    """The server itself (in the child process, on one asyncio loop)."""

    def __init__(self, root: Path, latency: float) -> None:
        self.root = root
        self.latency = latency
        self.stats = Stats()
        self._in_flight = 0
        # path -> (size, mtime_ns, body, etag, last-modified)
        self._cache: dict[Path, tuple[int, int, bytes, str, str]] = {}

    async def serve(self, stop: asyncio.Event) -> None:
        server = await asyncio.start_server(self._connection, HOST, 0, backlog=1024)
        print(server.sockets[0].getsockname()[1], flush=True)
        async with server:
            await stop.wait()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IO_TIMEOUT)
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length") or 0)
                body = await reader.readexactly(length) if length else b""
                await self._request(method, target, headers, body, writer)
                if headers.get("connection", "").lower() == "close":
                    return
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()

    def _control(self, action: str, payload: dict[str, Any]) -> dict[str, Any]:
        cpu = os.times()
        answer = {**self.stats.to_json(), "cpu_s": cpu.user + cpu.system}
        if action == "reset":
            self.stats = Stats()
            if payload.get("latency") is not None:
                self.latency = float(payload["latency"])
        elif action != "stats":
            raise ValueError(action)
        return answer

    async def _request(
        self, method: str, target: str, headers: dict[str, str], body: bytes, writer: Any
    ) -> None:
        if target.startswith(CONTROL):
            answer = self._control(target[len(CONTROL) :], json.loads(body or b"{}"))
            self._respond(writer, 200, {"Content-Type": "application/json"}, json.dumps(answer))
            return
        path = urllib.parse.unquote(urllib.parse.urlsplit(target).path).lstrip("/")
        bucket, _, key = path.partition("/")
        self._in_flight += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            status, out, payload = self._answer(method, bucket, key, headers.get("range"))
            kind = "LIST" if method == "GET" and not key else method
            sent = 0 if method == "HEAD" else len(payload)
            self.stats.add(Request(kind, key, headers.get("range"), len(body), sent, status))
            self._respond(writer, status, out, payload, head=method == "HEAD")
            await writer.drain()
        finally:
            self._in_flight -= 1

    def _object(self, bucket: str, key: str) -> tuple[int, int, bytes, str, str] | None:
        path = (self.root / bucket / key).resolve()
        if not key or self.root not in path.parents:
            return None
        try:
            st = path.stat()
        except OSError:
            return None
        hit = self._cache.get(path)
        if hit is not None and hit[:2] == (st.st_size, st.st_mtime_ns):
            return hit
        if not path.is_file():
            return None
        data = path.read_bytes()
        etag = f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'
        stamp = email.utils.formatdate(st.st_mtime, usegmt=True)
        self._cache[path] = entry = (st.st_size, st.st_mtime_ns, data, etag, stamp)
        return entry

    def _answer(
        self, method: str, bucket: str, key: str, rng: str | None
    ) -> tuple[int, dict[str, str], bytes | str]:
        xml = {"Content-Type": "application/xml"}
        if method not in ("GET", "HEAD"):
            return 405, xml, _MISSING.format(code="MethodNotAllowed", message="read-only", key=key)
        entry = self._object(bucket, key)
        if entry is None:
            return 404, xml, _MISSING.format(code="NoSuchKey", message="no such key", key=key)
        size, _, data, etag, stamp = entry
        out = {
            "Content-Type": "application/octet-stream",
            "ETag": etag,
            "Last-Modified": stamp,
            "Accept-Ranges": "bytes",
        }
        if rng is None:
            return 200, out, data
        span = parse_range(rng, size)
        if span is None:
            out = {**xml, "Content-Range": f"bytes */{size}"}
            return 416, out, _MISSING.format(code="InvalidRange", message=rng, key=key)
        start, stop = span
        out["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
        return 206, out, data[start:stop]

    @staticmethod
    def _respond(
        writer: Any, status: int, headers: dict[str, str], body: bytes | str, head: bool = False
    ) -> None:
        payload = body.encode() if isinstance(body, str) else body
        lines = [f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines += [
            f"Content-Length: {len(payload)}",
            "x-amz-request-id: 0",
            f"Date: {email.utils.formatdate(time.time(), usegmt=True)}",
            "Connection: keep-alive",
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head:
            writer.write(payload)


def _main(root: str, latency: str, cpu: str) -> None:
    if cpu != "None":
        os.sched_setaffinity(0, {int(cpu)})
    serve_until_stdin_closes(_StaticServer(Path(root), float(latency)))


if __name__ == "__main__":
    _main(*sys.argv[1:4])
