"""A light S3-compatible server, for measuring clients rather than servers.

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
- with ``writable=True``, PUT of a whole object (written to a temporary
  file in the key's directory, then renamed over the key, so a GET never
  sees half an object; a ``Content-MD5`` or ``x-amz-checksum-crc32`` header
  is checked; the response carries the object's ``ETag``; ``If-Match:
  <etag>`` and ``If-None-Match: *`` are honoured as S3 honours them: 412
  PreconditionFailed when the object is not that version, or exists;
  a conditional PUT is recorded with its condition), DELETE (204
  whether the key existed or not, as S3; DeleteObjects too, which obstore
  sends for a single key) and ListObjectsV2 (one page, for
  zarr's ``list_prefix``/``delete_dir``); without it these answer 405;
- signatures are ignored;
- the latency is added by the server itself (``asyncio.sleep`` before each
  response, concurrently across connections), and requests and bytes are
  counted as the proxy counts them (`zarr_fused_testing.s3.Stats`).

Connections are kept alive (HTTP/1.1). File contents are cached by path,
size and mtime, so a request costs a ``stat`` and a write. The handle talks
to the process over the proxy's control requests; the process exits when its
stdin closes.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import hashlib
import http
import json
import os
import sys
import tempfile
import time
import urllib.parse
import zlib
from pathlib import Path
from typing import Any
from xml.etree import ElementTree
from xml.sax.saxutils import escape

from zarr_fused_testing.s3 import (
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
    ``writable``: accept PUT and DELETE (stored under ``root``) and list.
    `reset` returns the counters since the last reset and sets the latency;
    `cpu_seconds` is the server process' CPU time so far (user + system).
    """

    name = "the static S3 server"

    def __init__(
        self, root: Path, latency: float = 0.0, cpu: int | None = None, writable: bool = False
    ) -> None:
        super().__init__(latency)
        self.root = Path(root).resolve()
        self.cpu = cpu
        self.writable = writable

    def _argv(self) -> list[str]:
        args = [str(self.root), str(self.latency), str(self.cpu), str(int(self.writable))]
        return [sys.executable, "-m", "zarr_fused_testing.s3_static", *args]

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


#: the prefix of the temporary files a PUT writes before renaming (never listed)
_TEMP = ".put-"
_LIST_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
    "<Name>{bucket}</Name><Prefix>{prefix}</Prefix><KeyCount>{count}</KeyCount>"
    "<MaxKeys>{count}</MaxKeys>{delimiter}<IsTruncated>false</IsTruncated>{entries}"
    "</ListBucketResult>"
)

type Answer = tuple[int, dict[str, str], bytes | str]


def _error(status: int, code: str, message: str, key: str) -> Answer:
    body = _MISSING.format(code=code, message=escape(message), key=escape(key))
    return status, {"Content-Type": "application/xml"}, body


def _etag(data: bytes) -> str:
    return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'


def _bad_digest(headers: dict[str, str], body: bytes) -> str | None:
    """The name of a checksum header ``body`` does not match, or None. S3
    refuses such a request (400 BadDigest); s3fs sends CRC32 with a PUT and
    MD5 with a DeleteObjects, obstore MD5 and SHA-256 with a DeleteObjects."""
    digests = {
        "content-md5": lambda: hashlib.md5(body, usedforsecurity=False).digest(),
        "x-amz-checksum-crc32": lambda: zlib.crc32(body).to_bytes(4, "big"),
        "x-amz-checksum-sha256": lambda: hashlib.sha256(body).digest(),
    }
    for name, digest in digests.items():
        sent = headers.get(name)
        if sent is not None and base64.b64decode(sent) != digest():
            return name
    return None


def _condition(headers: dict[str, str]) -> str | None:
    """The precondition a request carries, as the client sent it."""
    for name in ("if-match", "if-none-match"):
        if name in headers:
            return f"{name}: {headers[name]}"
    return None


async def _read_body(reader: asyncio.StreamReader, writer: Any, headers: dict[str, str]) -> bytes:
    """The request body: ``Content-Length`` bytes, after a ``100 Continue``
    when the client waits for one; a chunked body is refused (no client of
    ours sends one here: `tests/test_s3_static.py` writes through both)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise ConnectionError("chunked request bodies are not served")
    length = int(headers.get("content-length") or 0)
    if length and headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    return await reader.readexactly(length) if length else b""


class _StaticServer:
    """The server itself (in the child process, on one asyncio loop)."""

    def __init__(self, root: Path, latency: float, writable: bool = False) -> None:
        self.root = root
        self.latency = latency
        self.writable = writable
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
                body = await _read_body(reader, writer, headers)
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
        url = urllib.parse.urlsplit(target)
        bucket, _, key = urllib.parse.unquote(url.path).lstrip("/").partition("/")
        self._in_flight += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            if method == "GET" and not key:
                kind, answer = "LIST", self._list(bucket, urllib.parse.parse_qs(url.query))
            elif method in ("PUT", "DELETE"):
                kind, answer = method, self._change(method, bucket, key, headers, body)
            elif method == "POST" and not key and url.query == "delete":
                kind, answer = "DELETE", self._delete_objects(bucket, headers, body)
            else:
                kind, answer = method, self._answer(method, bucket, key, headers.get("range"))
            status, out, payload = answer
            sent = 0 if method == "HEAD" else len(payload)
            condition = _condition(headers) if method == "PUT" else None
            self.stats.add(
                Request(kind, key, headers.get("range"), len(body), sent, status, None, condition)
            )
            self._respond(writer, status, out, payload, head=method == "HEAD")
            await writer.drain()
        finally:
            self._in_flight -= 1

    def _path(self, bucket: str, key: str) -> Path | None:
        """The file of ``bucket/key``, or None when it would lie outside the
        served directory (a ``..`` segment) or name a temporary file."""
        path = (self.root / bucket / key).resolve()
        if not key or self.root not in path.parents or path.name.startswith(_TEMP):
            return None
        return path

    def _change(
        self, method: str, bucket: str, key: str, headers: dict[str, str], body: bytes
    ) -> Answer:
        path = self._path(bucket, key)
        if not self.writable:
            return _error(405, "MethodNotAllowed", "read-only", key)
        if path is None or not (self.root / bucket).is_dir():
            return _error(404, "NoSuchBucket" if path else "NoSuchKey", "no such key", key)
        if method == "DELETE":
            self._drop(path)
            return 204, {}, b""
        if "x-amz-copy-source" in headers:
            return _error(501, "NotImplemented", "copies are not served", key)
        bad = _bad_digest(headers, body)
        if bad is not None:
            return _error(400, "BadDigest", f"{bad} does not match the body", key)
        if not self._precondition_holds(bucket, key, headers):
            return _error(412, "PreconditionFailed", "a precondition does not hold", key)
        return 200, {"ETag": self._store(path, body)}, b""

    def _precondition_holds(self, bucket: str, key: str, headers: dict[str, str]) -> bool:
        """``If-None-Match: *``: no object at the key; ``If-Match``: the
        object there has that ETag. The check and the store that follows run
        on the server's one loop with no ``await`` between them, so no other
        PUT can come between."""
        entry = self._object(bucket, key)
        if headers.get("if-none-match", "").strip() == "*" and entry is not None:
            return False
        wanted = headers.get("if-match")
        return wanted is None or (entry is not None and entry[3] == wanted.strip())

    def _delete_objects(self, bucket: str, headers: dict[str, str], body: bytes) -> Answer:
        """DeleteObjects (``POST ?delete``): obstore deletes even one key so.
        Every key is reported deleted, as S3 does for missing keys."""
        if not self.writable:
            return _error(405, "MethodNotAllowed", "read-only", "")
        bad = _bad_digest(headers, body)
        if bad is not None:
            return _error(400, "BadDigest", f"{bad} does not match the body", "")
        keys = [k.text or "" for k in ElementTree.fromstring(body).iter() if k.tag.endswith("Key")]
        for key in keys:
            path = self._path(bucket, key)
            if path is not None:
                self._drop(path)
        deleted = "".join(f"<Deleted><Key>{escape(k)}</Key></Deleted>" for k in keys)
        xml = f'<?xml version="1.0" encoding="UTF-8"?>\n<DeleteResult>{deleted}</DeleteResult>'
        return 200, {"Content-Type": "application/xml"}, xml

    def _drop(self, path: Path) -> None:
        """Delete the object at ``path``; a directory (a key prefix, which
        s3fs deletes as a key too) is no object and stays."""
        if path.is_file():
            path.unlink()
        self._cache.pop(path, None)

    def _store(self, path: Path, body: bytes) -> str:
        """Write ``body`` as the file ``path`` at once (a temporary file in
        its directory renamed over it) and cache it; returns its ETag."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temp = tempfile.mkstemp(prefix=_TEMP, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body)
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        st = path.stat()
        etag = _etag(body)
        stamp = email.utils.formatdate(st.st_mtime, usegmt=True)
        self._cache[path] = (st.st_size, st.st_mtime_ns, body, etag, stamp)
        return etag

    def _list(self, bucket: str, query: dict[str, list[str]]) -> Answer:
        """ListObjectsV2, every match in one page (zarr asks with and
        without a ``/`` delimiter)."""
        if not self.writable:
            return _error(405, "MethodNotAllowed", "read-only", "")
        top = self.root / bucket
        if not top.is_dir():
            return _error(404, "NoSuchBucket", "no such bucket", "")
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        keys: list[str] = []
        for here, _, files in os.walk(top / prefix.rpartition("/")[0]):
            rel = Path(here).relative_to(top).as_posix()
            base = "" if rel == "." else rel + "/"
            keys += [base + f for f in files if not f.startswith(_TEMP)]
        entries, common = [], set()
        for key in sorted(k for k in keys if k.startswith(prefix)):
            rest = key[len(prefix) :]
            if delimiter and delimiter in rest:
                common.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
                continue
            entries.append(self._list_entry(bucket, key))
        entries += [
            f"<CommonPrefixes><Prefix>{escape(c)}</Prefix></CommonPrefixes>" for c in sorted(common)
        ]
        body = _LIST_XML.format(
            bucket=escape(bucket),
            prefix=escape(prefix),
            count=len(entries),
            delimiter=f"<Delimiter>{escape(delimiter)}</Delimiter>" if delimiter else "",
            entries="".join(entries),
        )
        return 200, {"Content-Type": "application/xml"}, body

    def _list_entry(self, bucket: str, key: str) -> str:
        entry = self._object(bucket, key)
        assert entry is not None
        size, mtime_ns, _, etag, _ = entry
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(mtime_ns / 1e9))
        return (
            f"<Contents><Key>{escape(key)}</Key><LastModified>{stamp}</LastModified>"
            f"<ETag>{escape(etag)}</ETag><Size>{size}</Size>"
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )

    def _object(self, bucket: str, key: str) -> tuple[int, int, bytes, str, str] | None:
        path = self._path(bucket, key)
        if path is None:
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
        etag = _etag(data)
        stamp = email.utils.formatdate(st.st_mtime, usegmt=True)
        self._cache[path] = entry = (st.st_size, st.st_mtime_ns, data, etag, stamp)
        return entry

    def _answer(self, method: str, bucket: str, key: str, rng: str | None) -> Answer:
        if method not in ("GET", "HEAD"):
            return _error(405, "MethodNotAllowed", f"{method} is not served", key)
        entry = self._object(bucket, key)
        if entry is None:
            return _error(404, "NoSuchKey", "no such key", key)
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
            status, xml, body = _error(416, "InvalidRange", rng, key)
            return status, {**xml, "Content-Range": f"bytes */{size}"}, body
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


def _main(root: str, latency: str, cpu: str, writable: str) -> None:
    if cpu != "None":
        os.sched_setaffinity(0, {int(cpu)})
    serve_until_stdin_closes(_StaticServer(Path(root), float(latency), writable == "1"))


if __name__ == "__main__":
    _main(*sys.argv[1:5])
