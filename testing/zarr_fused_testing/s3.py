"""Real object-store servers for tests and benchmarks, on 127.0.0.1 only.

- `MotoServer`: moto's S3 server in server mode, in its own process (its
  request handling then does not compete with the test for the GIL).
- `LatencyProxy`: an HTTP proxy in front of it, on an asyncio loop in its
  own process too, that adds a fixed latency to every request, counts
  requests and bytes by kind (GET, PUT, HEAD, DELETE, LIST, POST) and injects
  faults (`Fault`) for keys matching a pattern.
- `RangeServer`: a read-only HTTP server serving files of a directory, with
  byte ranges (what zarr's `FsspecStore` over fsspec's `HTTPFileSystem` reads).

Each starts with a bounded wait and raises `ServerUnavailable` (fixtures turn
it into a skip with its message) when it cannot; `stop()` is idempotent. The
child processes run this module (``python -m zarr_fused_testing.s3
moto|proxy ...``) and exit when their stdin closes, so none outlives the
process that started it.
Nothing here imports zarr or zarr_fused: the benchmarks use it too.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import email.utils
import http.server
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Self

HOST = "127.0.0.1"
ACCESS_KEY = "zarr-fused-test"
SECRET_KEY = "zarr-fused-test-secret"
REGION = "us-east-1"
BUCKET = "zarr-fused-tests"  # the bucket of the tests' moto fixture (conftest.py)
START_TIMEOUT = 60.0  # seconds; moto imports for ~2-4 s on a busy host
# every wait on a socket below is bounded: a stuck client or server fails a
# test, it does not hang it
IO_TIMEOUT = 60.0


class ServerUnavailable(RuntimeError):
    """A test server could not start here (the message says why)."""


def announced_port(proc: subprocess.Popen[bytes]) -> int | None:
    """The port a child server prints as its first line once it listens
    (None if it says anything else, or nothing within `START_TIMEOUT`)."""
    assert proc.stdout is not None
    stdout = proc.stdout
    line = b""
    ready = threading.Event()

    def first_line() -> None:
        nonlocal line
        line = stdout.readline()
        ready.set()

    threading.Thread(target=first_line, daemon=True).start()
    if not ready.wait(START_TIMEOUT) or not line.strip().isdigit():
        return None
    return int(line)


def obstore_s3(bucket: str, endpoint: str, prefix: str | None = None, **options: Any) -> Any:
    """obstore's ``S3Store`` on ``bucket`` of the server at ``endpoint``:
    plain HTTP, the dummy credentials; ``options`` are the store's other
    keyword arguments (``client_options`` added to ``allow_http``)."""
    from obstore.store import S3Store

    options["client_options"] = {"allow_http": True, **options.get("client_options", {})}
    credentials = {"region": REGION, "access_key_id": ACCESS_KEY, "secret_access_key": SECRET_KEY}
    return S3Store(bucket, prefix=prefix, endpoint=endpoint, **credentials, **options)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _wait_for_http(url: str, deadline: float, alive: Any = None) -> None:
    """Until ``url`` answers any HTTP status, or ``deadline`` passes."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise ServerUnavailable(f"the server behind {url} exited while starting")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError as exc:
            last = exc
            time.sleep(0.05)
    raise ServerUnavailable(f"{url} did not answer within {START_TIMEOUT:.0f} s ({last})")


# -- moto -------------------------------------------------------------------------------


class MotoServer:
    """moto's S3 server (``python -m moto.server``) on a free port of 127.0.0.1.

    Credentials are never checked by moto; the dummy ones in ``ACCESS_KEY`` /
    ``SECRET_KEY`` only let clients sign requests.
    """

    def __init__(self) -> None:
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> MotoServer:
        try:
            import moto.server  # noqa: F401
        except ImportError as exc:
            raise ServerUnavailable(f"moto[server] is not installed: {exc}") from exc
        self.port = free_port()
        # werkzeug logs every request: to a file, never a pipe nobody drains
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the server
        # through this file's entry point: the server exits when its stdin
        # closes, so it never outlives this process (even one killed hard)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "zarr_fused_testing.s3", "moto", str(self.port)],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_for_http(
                f"{self.endpoint}/moto-api/",
                time.monotonic() + START_TIMEOUT,
                alive=lambda: self._proc is not None and self._proc.poll() is None,
            )
        except ServerUnavailable as exc:
            tail = self.log_tail()
            self.stop()
            raise ServerUnavailable(f"moto's S3 server did not start: {exc}\n{tail}") from None
        return self

    def log_tail(self, n: int = 2000) -> str:
        if self._log is None:
            return ""
        self._log.seek(0, os.SEEK_END)
        size = self._log.tell()
        self._log.seek(max(0, size - n))
        return self._log.read().decode(errors="replace")

    def stop(self) -> None:
        # Closing stdin ends the server through `_exit_with_stdin`'s
        # ``os._exit``; a SIGTERM at once would run the interpreter's
        # shutdown under moto's daemon request threads, which aborts the
        # server (and dumps core) when one of them holds stderr's lock.
        proc, self._proc = self._proc, None
        if proc is not None:
            end_child(proc)
        if self._log is not None:
            self._log.close()
            self._log = None

    def client(self) -> Any:
        """A boto3 client straight to moto (not through any proxy): for setup
        and for looking at what is stored without counting requests."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str = "") -> dict[str, bytes]:
        """Every object under ``prefix`` and its bytes, by key."""
        client = self.client()
        out: dict[str, bytes] = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                out[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
        return out

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the proxy ----------------------------------------------------------------------------


FaultKind = Literal["500", "503", "reset", "truncate"]


@dataclass
class Fault:
    """Fail requests whose key matches ``pattern`` (``re.search``).

    ``kind``: ``"500"`` / ``"503"`` answer with that status and an S3 error
    body, without forwarding; ``"reset"`` drops the client connection with a
    TCP reset before forwarding (an upload then never reaches the server);
    ``"truncate"`` forwards, then sends the headers (with the full
    Content-Length) and only half the body before dropping the connection.
    ``method``: only requests of that kind (``"GET"``, ``"PUT"``, ...).
    ``times``: only the first that many matching requests (then they pass:
    "503 then success"); ``None`` for every one.
    """

    kind: FaultKind
    pattern: str
    method: str | None = None
    times: int | None = None
    hits: int = 0


@dataclass(frozen=True)
class Request:
    """One request the proxy saw."""

    kind: str  # GET, PUT, HEAD, DELETE, LIST, POST
    key: str  # the object key (no bucket), "" for bucket-level requests
    range: str | None  # the Range header, if any
    sent: int  # request body bytes
    received: int  # response body bytes the client got
    status: int
    fault: str | None = None
    #: the precondition a PUT carried (``If-Match: <etag>`` or
    #: ``If-None-Match: *``), where the server records it (the static server)
    condition: str | None = None


@dataclass
class Stats:
    requests: collections.Counter[str] = field(default_factory=collections.Counter)
    bytes_sent: collections.Counter[str] = field(default_factory=collections.Counter)
    bytes_received: collections.Counter[str] = field(default_factory=collections.Counter)
    log: list[Request] = field(default_factory=list)
    max_in_flight: int = 0

    faults: list[Fault] = field(default_factory=list)

    def count(self, *kinds: str) -> int:
        return sum(self.requests[k] for k in kinds)

    def add(self, req: Request) -> None:
        self.requests[req.kind] += 1
        self.bytes_sent[req.kind] += req.sent
        self.bytes_received[req.kind] += req.received
        self.log.append(req)

    def to_json(self, faults: list[Fault] = ()) -> dict[str, Any]:
        return {
            **self.summary(),
            "log": [dataclasses.asdict(r) for r in self.log],
            "faults": [dataclasses.asdict(f) for f in faults],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stats:
        return cls(
            collections.Counter(data["requests"]),
            collections.Counter(data["bytes_sent"]),
            collections.Counter(data["bytes_received"]),
            [Request(**r) for r in data["log"]],
            data["max_in_flight"],
            [Fault(**f) for f in data["faults"]],
        )

    def summary(self) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "bytes_sent": dict(self.bytes_sent),
            "bytes_received": dict(self.bytes_received),
            "max_in_flight": self.max_in_flight,
        }


class _BadRequest(Exception):
    pass


def _split_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return lines[0], headers


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    name = name.lower()
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def _without(headers: list[tuple[str, str]], *names: str) -> list[tuple[str, str]]:
    drop = {n.lower() for n in names}
    return [(k, v) for k, v in headers if k.lower() not in drop]


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[str, str]]) -> bytes:
    """A message body framed by Content-Length or chunked transfer coding
    (returned de-chunked)."""
    if (_header(headers, "transfer-encoding") or "").lower() == "chunked":
        parts = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers expected
                return b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length = int(_header(headers, "content-length") or 0)
    return await reader.readexactly(length) if length else b""


def _classify(method: str, target: str) -> tuple[str, str]:
    """(kind, key) of a path-style S3 request: ``/bucket/key?query``."""
    url = urllib.parse.urlsplit(target)
    path = urllib.parse.unquote(url.path).lstrip("/")
    _bucket, _, key = path.partition("/")
    if method == "GET" and not key:
        return "LIST", key
    return method, key


def _reset(writer: asyncio.StreamWriter) -> None:
    """Drop the connection with a TCP RST (SO_LINGER 0), not a clean FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


_ERROR_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    "<Message>injected by the test proxy</Message><Key>{key}</Key></Error>"
)


CONTROL = "/__proxy__/"  # the proxy's own control requests: never counted nor delayed


class ChildServer:
    """The handle on a server in a child process (the latency proxy, the
    static S3 server): the child prints its port as its first line, answers
    control requests under `CONTROL` with JSON, and exits when its stdin
    closes, so it never outlives this process. Subclasses say how to start
    it (`_argv`) and what to call it in errors (``name``). Both children
    count requests (`stats`) and add ``latency`` seconds to each."""

    name = "the server"

    def __init__(self, latency: float = 0.0) -> None:
        self.port = 0
        self._latency = latency
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _control(self, action: str, payload: dict[str, Any] | None = None) -> Any:
        req = urllib.request.Request(
            self.endpoint + CONTROL + action,
            method="POST",
            data=json.dumps(payload or {}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=IO_TIMEOUT) as resp:
            return json.loads(resp.read())

    @property
    def latency(self) -> float:
        return self._latency

    @property
    def stats(self) -> Stats:
        """The counters so far (a snapshot)."""
        return Stats.from_json(self._control("stats"))

    def reset(self, latency: float | None = None) -> Stats:
        """Clear the counters (the proxy: and its faults), and set
        ``latency`` in seconds when given; returns the counters before."""
        old = Stats.from_json(self._control("reset", {"latency": latency}))
        if latency is not None:
            self._latency = latency
        return old

    def start(self) -> Self:
        self._proc = subprocess.Popen(
            self._argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        port = announced_port(self._proc)
        if port is None:
            self.stop()
            raise ServerUnavailable(f"{self.name} did not start")
        self.port = port
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        end_child(proc)
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LatencyProxy(ChildServer):
    """An HTTP/1.1 proxy on 127.0.0.1 in front of ``upstream``, in its own
    process: it then never competes for this process' GIL with the code under
    measurement (a peer that blocks on IO holding the GIL would otherwise
    stall its own requests). This object is its handle: counters and faults
    travel over control requests to the proxy's port.

    Client connections are kept alive; each request goes upstream on a fresh
    connection, and its response is re-framed with a Content-Length.
    ``latency`` seconds are added before each request is forwarded,
    concurrently across connections, as a network round trip would.
    """

    name = "the test proxy"

    def __init__(self, upstream: str, latency: float = 0.0) -> None:
        super().__init__(latency)
        self.upstream = upstream

    def _argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "zarr_fused_testing.s3",
            "proxy",
            self.upstream,
            str(self._latency),
        ]

    @property
    def latency(self) -> float:
        return self._latency

    @latency.setter
    def latency(self, value: float) -> None:
        self._control("latency", {"latency": value})
        self._latency = value

    def inject(self, fault: Fault) -> int:
        """Add ``fault``; returns its number, for `hits`."""
        return self._control("inject", dataclasses.asdict(fault))["index"]

    def hits(self, index: int) -> int:
        """How many requests fault ``index`` has failed so far."""
        return self.stats.faults[index].hits


class _ProxyServer:
    """The proxy itself (in the child process, on one asyncio loop)."""

    def __init__(self, upstream: str, latency: float) -> None:
        url = urllib.parse.urlsplit(upstream)
        self.upstream = (url.hostname or HOST, url.port or 80)
        self.latency = latency
        self.stats = Stats()
        self.faults: list[Fault] = []
        self._in_flight = 0
        self._conns: set[asyncio.Task[None]] = set()

    async def serve(self, stop: asyncio.Event) -> None:
        server = await asyncio.start_server(self._connection, HOST, 0, limit=1 << 20)
        print(server.sockets[0].getsockname()[1], flush=True)
        async with server:
            await stop.wait()
            server.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            while True:
                try:
                    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IO_TIMEOUT)
                except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
                    return
                if not await self._request(head, reader, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._conns.discard(task)
            if not writer.transport.is_closing():
                writer.close()

    def _control(self, action: str, payload: dict[str, Any]) -> Any:
        if action == "stats":
            return self.stats.to_json(self.faults)
        if action == "reset":
            old = self.stats.to_json(self.faults)
            self.stats, self.faults = Stats(), []
            if payload.get("latency") is not None:
                self.latency = float(payload["latency"])
            return old
        if action == "latency":
            self.latency = float(payload["latency"])
            return {}
        if action == "inject":
            self.faults.append(Fault(**payload))
            return {"index": len(self.faults) - 1}
        raise ValueError(action)

    def _match(self, kind: str, key: str) -> Fault | None:
        for fault in self.faults:
            if fault.method not in (None, kind) or not re.search(fault.pattern, key):
                continue
            if fault.times is not None and fault.hits >= fault.times:
                continue
            fault.hits += 1
            return fault
        return None

    def _record(self, req: Request) -> None:
        self.stats.add(req)

    async def _request(
        self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Serve one request; False when the client connection must end."""
        request_line, headers = _split_head(head)
        method, target, _version = request_line.split(" ", 2)
        if (_header(headers, "expect") or "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        body = await asyncio.wait_for(_read_body(reader, headers), IO_TIMEOUT)
        if target.startswith(CONTROL):
            answer = self._control(target[len(CONTROL) :], json.loads(body or b"{}"))
            await self._respond(
                writer,
                200,
                [("Content-Type", "application/json")],
                json.dumps(answer).encode(),
                method,
            )
            return True
        kind, key = _classify(method, target)
        rng = _header(headers, "range")
        self._in_flight += 1
        self.stats.max_in_flight = max(self.stats.max_in_flight, self._in_flight)
        latency = self.latency
        try:
            if latency:
                await asyncio.sleep(latency)
            fault = self._match(kind, key)
            if fault is not None and fault.kind in ("500", "503"):
                code = "InternalError" if fault.kind == "500" else "SlowDown"
                status = int(fault.kind)
                payload = _ERROR_BODY.format(code=code, key=key).encode()
                self._record(Request(kind, key, rng, len(body), len(payload), status, fault.kind))
                await self._respond(
                    writer, status, [("Content-Type", "application/xml")], payload, method
                )
                return True
            if fault is not None and fault.kind == "reset":
                self._record(Request(kind, key, rng, len(body), 0, 0, "reset"))
                _reset(writer)
                return False
            status, resp_headers, resp_body = await self._forward(request_line, headers, body)
            if fault is not None and fault.kind == "truncate" and method != "HEAD" and resp_body:
                half = resp_body[: len(resp_body) // 2]
                self._record(Request(kind, key, rng, len(body), len(half), status, "truncate"))
                await self._respond(writer, status, resp_headers, resp_body, method, cut=len(half))
                _reset(writer)
                return False
            self._record(
                Request(
                    kind, key, rng, len(body), 0 if method == "HEAD" else len(resp_body), status
                )
            )
            await self._respond(writer, status, resp_headers, resp_body, method)
            return (_header(headers, "connection") or "").lower() != "close"
        finally:
            self._in_flight -= 1

    async def _forward(
        self, request_line: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        up_reader, up_writer = await asyncio.wait_for(
            asyncio.open_connection(*self.upstream, limit=1 << 20), IO_TIMEOUT
        )
        try:
            out = _without(
                headers,
                "connection",
                "keep-alive",
                "transfer-encoding",
                "content-length",
                "expect",
                "proxy-connection",
            )
            out += [("Content-Length", str(len(body))), ("Connection", "close")]
            up_writer.write(
                ("\r\n".join([request_line, *(f"{k}: {v}" for k, v in out)]) + "\r\n\r\n").encode(
                    "latin-1"
                )
                + body
            )
            await up_writer.drain()
            return await asyncio.wait_for(
                self._read_response(up_reader, request_line.split(" ", 1)[0]), IO_TIMEOUT
            )
        finally:
            up_writer.close()

    @staticmethod
    async def _read_response(
        reader: asyncio.StreamReader, method: str
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """One response, framed by its headers (a HEAD response has none, and
        werkzeug need not close the connection after one): by Content-Length,
        chunked coding, or else the end of the connection."""
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, headers = _split_head(head)
        status = int(status_line.split(" ", 2)[1])
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return status, headers, b""
        if (_header(headers, "transfer-encoding") or "").lower() == "chunked" or _header(
            headers, "content-length"
        ) is not None:
            return status, headers, await _read_body(reader, headers)
        return status, headers, await reader.read()

    async def _respond(
        self,
        writer: asyncio.StreamWriter,
        status: int,
        headers: list[tuple[str, str]],
        body: bytes,
        method: str,
        cut: int | None = None,
    ) -> None:
        out = _without(headers, "connection", "keep-alive", "transfer-encoding")
        if method == "HEAD":
            if _header(out, "content-length") is None:
                out.append(("Content-Length", "0"))
            payload = b""
        else:
            out = _without(out, "content-length") + [("Content-Length", str(len(body)))]
            payload = body if cut is None else body[:cut]
        out.append(("Connection", "keep-alive"))
        try:
            reason = http.HTTPStatus(status).phrase
        except ValueError:
            reason = "Unknown"
        writer.write(
            (
                f"HTTP/1.1 {status} {reason}\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in out)
                + "\r\n"
            ).encode("latin-1")
            + payload
        )
        await writer.drain()


# -- a read-only HTTP server with byte ranges ---------------------------------------------


_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class RangeServer:
    """Serves the files under ``root`` read-only over HTTP on 127.0.0.1, with
    single byte ranges (``bytes=a-b``, ``bytes=a-``, ``bytes=-n``) and HEAD;
    404 for what does not exist. Counts requests and body bytes by method in
    `stats` (a `Stats`)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self.stats = Stats()
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://{HOST}:{self._server.server_address[1]}"

    def reset(self) -> Stats:
        with self._lock:
            old, self.stats = self.stats, Stats()
        return old

    def _record(self, req: Request) -> None:
        with self._lock:
            self.stats.requests[req.kind] += 1
            self.stats.bytes_received[req.kind] += req.received
            self.stats.log.append(req)

    def start(self) -> RangeServer:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = IO_TIMEOUT

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

            def _file(self) -> Path | None:
                rel = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
                path = (owner.root / rel).resolve()
                if owner.root not in path.parents or not path.is_file():
                    return None
                return path

            def _send(self, status: int, body: bytes, extra: dict[str, str], head: bool) -> None:
                self.send_response(status)
                self.send_header("Accept-Ranges", "bytes")
                for k, v in extra.items():
                    self.send_header(k, v)
                if "Content-Length" not in extra:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)
                key = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
                owner._record(
                    Request(
                        self.command,
                        key,
                        self.headers.get("Range"),
                        0,
                        0 if head else len(body),
                        status,
                    )
                )

            def _serve(self, head: bool) -> None:
                path = self._file()
                if path is None:
                    self._send(404, b"not found", {}, head)
                    return
                data = path.read_bytes()
                size = len(data)
                stamp = email.utils.formatdate(path.stat().st_mtime, usegmt=True)
                rng = self.headers.get("Range")
                if rng is None:
                    extra = {"Last-Modified": stamp}
                    if head:
                        extra["Content-Length"] = str(size)
                    self._send(200, data, extra, head)
                    return
                m = _RANGE.match(rng.strip())
                if m is None or m.groups() == ("", ""):
                    self._send(416, b"", {"Content-Range": f"bytes */{size}"}, head)
                    return
                first, last = m.groups()
                if first == "":
                    start, stop = max(0, size - int(last)), size
                else:
                    start = int(first)
                    stop = size if last == "" else min(size, int(last) + 1)
                if start >= size or start >= stop:
                    self._send(416, b"", {"Content-Range": f"bytes */{size}"}, head)
                    return
                self._send(
                    206,
                    data[start:stop],
                    {"Content-Range": f"bytes {start}-{stop - 1}/{size}", "Last-Modified": stamp},
                    head,
                )

            def do_GET(self) -> None:
                self._serve(head=False)

            def do_HEAD(self) -> None:
                self._serve(head=True)

        try:
            self._server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        except OSError as exc:
            raise ServerUnavailable(f"the HTTP range server did not start: {exc}") from exc
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="http-range-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(IO_TIMEOUT)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- the child processes ------------------------------------------------------------------


def end_child(proc: subprocess.Popen[bytes]) -> None:
    """End a server child by closing its stdin (it exits on its own, see
    `_exit_with_stdin`), killing it only if it has not gone in 10 s."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def serve_until_stdin_closes(server: Any) -> None:
    """Run ``server.serve(stop)`` (an asyncio server of a `ChildServer`
    child) until this process' stdin reaches its end: the parent closed it,
    or died."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def watch_stdin() -> None:
            sys.stdin.buffer.read()
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=watch_stdin, daemon=True).start()
        await server.serve(stop)

    asyncio.run(main())


def _exit_with_stdin() -> None:
    """Exit this process when stdin reaches its end (the parent closed it or died)."""

    def watch() -> None:
        sys.stdin.buffer.read()
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def _atomic_conditional_puts() -> None:
    """Make moto's conditional PutObject atomic, as S3's is.

    moto checks ``If-Match`` / ``If-None-Match`` against the stored object
    and then stores the new one, on its server's threads, with nothing to
    stop another PUT between the two: two writers holding the same ETag can
    both pass the check, and the one stored first is lost (seen once in
    640 inner chunks by tests/test_object_cas.py's spawned writers). S3
    checks and stores at once. One lock around moto's PutObject handler
    gives moto S3's answer; moto serves one request at a time under its
    GIL anyway."""
    import functools

    from moto.s3.responses import S3Response

    put = S3Response.put_object
    lock = threading.Lock()

    @functools.wraps(put)
    def locked(self: Any) -> Any:
        with lock:
            return put(self)

    S3Response.put_object = locked  # type: ignore[method-assign]


if __name__ == "__main__" and sys.argv[1:2] == ["proxy"]:
    serve_until_stdin_closes(_ProxyServer(sys.argv[2], float(sys.argv[3])))
elif __name__ == "__main__" and sys.argv[1:2] == ["moto"]:
    _exit_with_stdin()
    _atomic_conditional_puts()
    from moto.server import main as moto_main

    moto_main(["-H", HOST, "-p", sys.argv[2]])
