"""Helpers for the integration suite: the server process, raw HTTP, the
KServe v2 binary tensor extension, BYTES serialisation, Prometheus parsing.

Only the standard library, numpy and tritonclient's dependencies are used.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import time
import zlib
from pathlib import Path

import numpy as np

try:  # tritonclient >= 2.6x requires ml_dtypes for BF16, so it is installed
    import ml_dtypes
    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = None

HOST = "127.0.0.1"

NP_DTYPES = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(object),
    "BF16": BF16,
}

CONFIG_TYPES = {
    "BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32", "UINT64": "TYPE_UINT64", "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64",
    "BYTES": "TYPE_STRING", "BF16": "TYPE_BF16",
}


# --------------------------------------------------------------------------
# Ports and the server process
# --------------------------------------------------------------------------

def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


_handed_out: set[int] = set()
_rng = random.Random(os.getpid() ^ time.time_ns())


def _candidates():
    """Ports outside the kernel's ephemeral range, in random order: a port picked from inside it
    could be taken by any outgoing connection (a client's, a server's) before the process the port is
    meant for binds it, which failed a CI run with "Address already in use"."""
    lo, hi = _ephemeral_range()
    pool = [p for p in range(10000, 65536) if not lo <= p <= hi and p not in _handed_out]
    _rng.shuffle(pool)
    return pool


def _free_both(port: int) -> socket.socket | None:
    """A TCP socket holding `port` on HOST, if the port is free for TCP and UDP alike."""
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        udp.bind((HOST, port))
        tcp.bind((HOST, port))
        return tcp
    except OSError:
        tcp.close()
        return None
    finally:
        udp.close()


def free_ports(n: int) -> list[int]:
    """n distinct ports, free for TCP and UDP a moment ago, never handed out before by this process,
    and outside the kernel's ephemeral range (so no outgoing connection takes one meanwhile)."""
    held: list[socket.socket] = []
    try:
        for port in _candidates():
            s = _free_both(port)
            if s is not None:
                held.append(s)
                if len(held) == n:
                    break
        assert len(held) == n, f"only {len(held)} free ports outside the ephemeral range"
        ports = [s.getsockname()[1] for s in held]
        _handed_out.update(ports)
        return ports
    finally:
        for s in held:
            s.close()


def wait_live(proc, port: int, log: Path, timeout: float = 30.0, path: str = "/v2/health/live"):
    """Waits until GET `path` on `port` answers 200, failing at once with the log if `proc` exits
    (for processes the tests start themselves, not through MeshServer)."""
    import urllib.request
    end = time.time() + timeout
    while time.time() < end:
        assert proc.poll() is None, f"the server process exited {proc.returncode}:\n{log.read_text()[-4000:]}"
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"not live within {timeout}s:\n{log.read_text()[-3000:]}")


def stop_process(proc, grace: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ServerStartError(RuntimeError):
    pass


class MeshServer:
    """One mesh-node process with its own ports and log file."""

    def __init__(self, binary: Path, repos: list[Path], args: list[str], log_path: Path,
                 env: dict[str, str]):
        self.binary = Path(binary)
        self.repos = [Path(r) for r in repos]
        self.args = list(args)
        self.log_path = Path(log_path)
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.http_port = self.grpc_port = self.metrics_port = 0
        self.started_at = 0.0

    # -- process ----------------------------------------------------------
    def command(self) -> list[str]:
        cmd = [str(self.binary)]
        for r in self.repos:
            cmd += ["--model-repository", str(r)]
        cmd += [
            "--http-address", HOST, "--http-port", str(self.http_port),
            "--grpc-address", HOST, "--grpc-port", str(self.grpc_port),
            "--metrics-port", str(self.metrics_port),
        ]
        return cmd + self.args

    def _spawn(self) -> None:
        self.http_port, self.grpc_port, self.metrics_port = free_ports(3)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== {time.strftime('%H:%M:%S')} $ {' '.join(self.command())}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, start_new_session=True)
        self.started_at = time.monotonic()

    def start(self, wait_models: list[str], timeout: float = 60.0) -> "MeshServer":
        for attempt in range(3):
            self._spawn()
            try:
                self.wait_up(wait_models, timeout)
                return self
            except ServerStartError:
                tail = self.log_tail(40)
                if self.proc.poll() is not None and re.search(r"address (already )?in use", tail, re.I) \
                        and attempt < 2:
                    continue  # a port was taken between picking and binding: retry
                self.kill()
                raise
        raise AssertionError("unreachable")

    def wait_up(self, wait_models: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout

        def alive_or_raise(what):
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"mesh-node exited with {self.proc.returncode} while waiting for {what}; "
                    f"log {self.log_path}:\n{self.log_tail(60)}")
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"mesh-node not up after {timeout}s waiting for {what}; "
                    f"log {self.log_path}:\n{self.log_tail(60)}")
            time.sleep(0.05)

        while True:
            try:
                if http_request(self.http_port, "GET", "/v2/health/live", timeout=2).status == 200:
                    break
            except OSError:
                pass
            alive_or_raise("GET /v2/health/live")
        for m in wait_models:
            while True:
                try:
                    if http_request(self.http_port, "GET", f"/v2/models/{m}/ready", timeout=2).status == 200:
                        break
                except OSError:
                    pass
                alive_or_raise(f"model {m} to be ready")
        for port, what in ((self.grpc_port, "gRPC port"), (self.metrics_port, "metrics port")):
            while True:
                try:
                    socket.create_connection((HOST, port), timeout=1).close()
                    break
                except OSError:
                    alive_or_raise(what)

    def settle(self, names: list[str], timeout: float = 20.0) -> list[dict]:
        """Wait until the repository index shows every name in a final state
        (not LOADING/UNLOADING); return the index. Never fails by itself."""
        deadline = time.monotonic() + timeout
        index: list[dict] = []
        while time.monotonic() < deadline:
            try:
                r = http_request(self.http_port, "POST", "/v2/repository/index", b"{}", timeout=5)
                if r.status == 200:
                    index = r.json()
                    states = {}
                    for e in index:
                        states.setdefault(e.get("name"), []).append(str(e.get("state", "")).upper())
                    if all(n in states and not any(s in ("", "LOADING", "UNLOADING") for s in states[n])
                           for n in names):
                        return index
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        return index

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.running():
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                pass

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace` seconds. Returns the exit code."""
        if self.running():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
        # make sure nothing it spawned survives
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return None if self.proc is None else self.proc.returncode

    def log_tail(self, lines: int = 80) -> str:
        try:
            data = self.log_path.read_bytes()[-200_000:]
        except OSError:
            return "<no log>"
        return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])

    # -- conveniences -----------------------------------------------------
    @property
    def http_url(self) -> str:
        return f"{HOST}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{HOST}:{self.grpc_port}"

    def get(self, path: str, **kw) -> "Response":
        return http_request(self.http_port, "GET", path, **kw)

    def post(self, path: str, body=b"", **kw) -> "Response":
        return http_request(self.http_port, "POST", path, body, **kw)

    def get_json(self, path: str):
        r = self.get(path)
        assert r.status == 200, f"GET {path}: {r.status} {r.body[:500]!r}"
        return r.json()

    def index(self) -> list[dict]:
        r = self.post("/v2/repository/index", b"{}")
        assert r.status == 200, f"index: {r.status} {r.body[:500]!r}"
        data = r.json()
        assert isinstance(data, list), data
        return data

    def metrics(self) -> str:
        r = http_request(self.metrics_port, "GET", "/metrics")
        assert r.status == 200, f"/metrics: {r.status}"
        return r.body.decode("utf-8")


# --------------------------------------------------------------------------
# Raw HTTP
# --------------------------------------------------------------------------

class Response:
    def __init__(self, status: int, reason: str, headers: dict[str, str], body: bytes):
        self.status = status
        self.reason = reason
        self.headers = headers  # lower-cased names
        self.body = body

    def header(self, name: str, default=None):
        return self.headers.get(name.lower(), default)

    def decoded_body(self) -> bytes:
        enc = (self.header("content-encoding") or "").strip().lower()
        if enc == "gzip":
            return gzip.decompress(self.body)
        if enc == "deflate":
            try:
                return zlib.decompress(self.body)
            except zlib.error:
                return zlib.decompress(self.body, -zlib.MAX_WBITS)
        return self.body

    def json(self):
        return json.loads(self.decoded_body())

    def error_message(self) -> str:
        """The `error` string of a KServe error body; asserts the shape."""
        try:
            data = self.json()
        except ValueError as e:
            raise AssertionError(f"error body is not JSON ({e}): {self.body[:300]!r}") from None
        assert isinstance(data, dict) and isinstance(data.get("error"), str) and data["error"], \
            f"expected {{\"error\": \"...\"}}, got {data!r}"
        return data["error"]

    def __repr__(self):
        return f"<Response {self.status} {self.body[:300]!r}>"


def http_request(port: int, method: str, path: str, body: bytes | str | None = None,
                 headers: dict[str, str] | None = None, timeout: float = 30.0) -> Response:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        if isinstance(body, str):
            body = body.encode("utf-8")
        hdrs = dict(headers or {})
        if body is not None and not any(k.lower() == "content-type" for k in hdrs):
            hdrs["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        data = r.read()
        return Response(r.status, r.reason, {k.lower(): v for k, v in r.getheaders()}, data)
    finally:
        conn.close()


def raw_exchange(port: int, head: bytes, body: bytes, timeout: float = 30.0) -> Response:
    """Send a request whose head carries `Expect: 100-continue`; send the body
    only if the server asks for it (or stays silent), tolerate the server
    closing early, and parse whatever final response comes back."""
    sock = socket.create_connection((HOST, port), timeout=timeout)
    buf = b""
    try:
        sock.sendall(head)
        sock.settimeout(2.0)
        try:
            chunk = sock.recv(65536)
            buf += chunk
        except socket.timeout:
            pass
        sock.settimeout(timeout)
        status = _status_of(buf)
        if status in (None, 100):
            if status == 100:
                buf = buf[buf.index(b"\r\n\r\n") + 4:]
            try:
                view = memoryview(body)
                for off in range(0, len(body), 65536):
                    sock.sendall(view[off:off + 65536])
            except (BrokenPipeError, ConnectionResetError):
                pass
        return _read_response(sock, buf)
    finally:
        sock.close()


def _status_of(buf: bytes):
    m = re.match(rb"HTTP/1\.[01] (\d{3})", buf)
    return int(m.group(1)) if m else None


def _read_response(sock, buf: bytes) -> Response:
    def more():
        try:
            return sock.recv(65536)
        except ConnectionResetError:
            return b""
    while True:
        while b"\r\n\r\n" not in buf:
            chunk = more()
            if not chunk:
                raise ConnectionError(f"connection closed before a response: {buf[:200]!r}")
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        if _status_of(head) == 100:
            buf = rest
            continue
        break
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    body = rest
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(body) < n:
            chunk = more()
            if not chunk:
                break
            body += chunk
        body = body[:n]
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        while not body.endswith(b"0\r\n\r\n"):
            chunk = more()
            if not chunk:
                break
            body += chunk
        body = _dechunk(body)
    else:
        while True:
            chunk = more()
            if not chunk:
                break
            body += chunk
    return Response(int(parts[1]), parts[2] if len(parts) > 2 else "", headers, body)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, data = data.partition(b"\r\n")
        n = int(size_line.split(b";")[0], 16)
        if n == 0:
            break
        out += data[:n]
        data = data[n + 2:]
    return out


# --------------------------------------------------------------------------
# KServe v2 inference over raw HTTP
# --------------------------------------------------------------------------

def infer_path(model: str, version: str | int | None = None) -> str:
    if version is None or version == "":
        return f"/v2/models/{model}/infer"
    return f"/v2/models/{model}/versions/{version}/infer"


def binary_body(header: dict, blobs: list[bytes]) -> tuple[bytes, dict[str, str]]:
    """Request body and headers for the binary tensor extension."""
    js = json.dumps(header).encode("utf-8")
    body = js + b"".join(blobs)
    return body, {"Inference-Header-Content-Length": str(len(js)),
                  "Content-Type": "application/octet-stream"}


def json_input(name: str, arr: np.ndarray, datatype: str) -> dict:
    if datatype == "BYTES":
        data = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in arr.flatten()]
    else:
        data = arr.flatten().tolist()
    return {"name": name, "shape": list(arr.shape), "datatype": datatype, "data": data}


def binary_input(name: str, arr: np.ndarray, datatype: str) -> tuple[dict, bytes]:
    raw = serialize_bytes(arr.flatten().tolist()) if datatype == "BYTES" else np.ascontiguousarray(arr).tobytes()
    return ({"name": name, "shape": list(arr.shape), "datatype": datatype,
             "parameters": {"binary_data_size": len(raw)}}, raw)


def parse_infer_response(r: Response) -> tuple[dict, dict[str, bytes]]:
    """(JSON header, {output name: raw bytes}) of a 200 infer response."""
    body = r.decoded_body()
    hl = r.header("inference-header-content-length")
    if hl is None:
        return json.loads(body), {}
    n = int(hl)
    header = json.loads(body[:n])
    blobs = {}
    off = n
    for out in header.get("outputs", []):
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            blobs[out["name"]] = body[off:off + size]
            off += size
    assert off == len(body), f"binary section is {len(body) - n} bytes, outputs claim {off - n}"
    return header, blobs


def output_array(header: dict, blobs: dict[str, bytes], name: str) -> np.ndarray:
    outs = [o for o in header["outputs"] if o["name"] == name]
    assert len(outs) == 1, f"output {name} appears {len(outs)} times in {header}"
    out = outs[0]
    dt = out["datatype"]
    shape = out["shape"]
    if name in blobs:
        if dt == "BYTES":
            return np.array(deserialize_bytes(blobs[name]), dtype=object).reshape(shape)
        return np.frombuffer(blobs[name], dtype=NP_DTYPES[dt]).reshape(shape)
    data = out["data"]
    if dt == "BYTES":
        return np.array([s.encode("utf-8") if isinstance(s, str) else s for s in data],
                        dtype=object).reshape(shape)
    return np.array(data, dtype=NP_DTYPES[dt]).reshape(shape)


# --------------------------------------------------------------------------
# BYTES: uint32 little-endian length + bytes, per element
# --------------------------------------------------------------------------

def serialize_bytes(items) -> bytes:
    out = bytearray()
    for it in items:
        b = it if isinstance(it, bytes) else str(it).encode("utf-8")
        out += struct.pack("<I", len(b)) + b
    return bytes(out)


def deserialize_bytes(data: bytes) -> list[bytes]:
    items, off = [], 0
    while off < len(data):
        (n,) = struct.unpack_from("<I", data, off)
        off += 4
        items.append(bytes(data[off:off + n]))
        off += n
    assert off == len(data), "truncated BYTES tensor"
    return items


# --------------------------------------------------------------------------
# Prometheus text format
# --------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = {k: v.encode().decode("unicode_escape") for k, v in _LABEL.findall(m.group(3) or "")}
        samples.append((m.group(1), labels, float(m.group(4))))
    return samples


def metric(samples, name: str, **labels) -> list[tuple[dict[str, str], float]]:
    """Samples named `name` whose labels include `labels`."""
    return [(lab, v) for n, lab, v in samples
            if n == name and all(lab.get(k) == str(val) for k, val in labels.items())]


def metric_sum(samples, name: str, **labels) -> float | None:
    found = metric(samples, name, **labels)
    return None if not found else sum(v for _, v in found)


def wait_pending(server, model: str, count: int, timeout: float = 60.0) -> None:
    """Waits until `count` requests of `model` are in flight on `server` (its
    nv_inference_pending_request_count): how a test knows that the requests it sent in the
    background have arrived, however long the machine takes, instead of sleeping and hoping."""
    deadline = time.monotonic() + timeout
    while True:
        now = metric_sum(parse_metrics(server.metrics()), "nv_inference_pending_request_count", model=model) or 0
        if int(now) == count:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{model}: {int(now)} requests in flight after {timeout}s, waiting for {count}")
        time.sleep(0.02)
