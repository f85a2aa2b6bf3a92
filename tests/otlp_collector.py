"""A stand-in for the OpenTelemetry Collector that Triton's trace tests run (qa/L0_trace: otelcol
v0.91.0 with qa/L0_trace/trace-config.yaml), which cannot be downloaded here.

It does what that configuration does, as far as the tests can see: an `otlp` receiver taking
OTLP/HTTP on POST /v1/traces with a protobuf body (what tritonserver 2.51 and the mesh send,
decoded with the `opentelemetry-proto` package) or a JSON one; the
`batch` processor with `send_batch_size: 10` and `timeout: 10s` (received resourceSpans pile up
unmerged and go out together once 10 spans are pending, or when the 10 s timer comes, counted from
the start or the last send); and the `file` exporter, which truncates its file when it starts and
writes one compact JSON line per batch sent, `{"resourceSpans":[...]}` in the Collector's JSON
form: ids as lowercase hex (`"parentSpanId":""` for a span without parent), times and integer
attribute values as decimal strings, `kind` a number, `"status":{}`, empty fields left out.

Use it as `python tests/otlp_collector.py --port 10000 --path collected_traces.json` (it runs
until killed), or in a test as `Collector(port, path)` with `start()`/`stop()`.

With `--sink` (benches/router_trace.sh) it only counts what it receives (OTLP requests, bytes and
spans, and the requests that name the service `mesh-router`), writes nothing and answers at once,
so that a benchmark's exporters pay the HTTP round trip and not this Python process's JSON work;
`GET /stats` gives the counts as JSON.
"""
from __future__ import annotations

import argparse
import base64
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from google.protobuf.message import DecodeError


def _value(v: dict) -> dict:
    """An AnyValue as the Collector writes it (integers as strings)."""
    if "intValue" in v:
        return {"intValue": str(v["intValue"])}
    if "arrayValue" in v:
        return {"arrayValue": {"values": [_value(x) for x in v["arrayValue"].get("values", [])]}}
    if "kvlistValue" in v:
        return {"kvlistValue": {"values": _attributes(v["kvlistValue"].get("values", []))}}
    return dict(v)


def _attributes(attrs) -> list:
    return [{"key": a["key"], "value": _value(a.get("value", {}))} for a in attrs or []]


def _times(span: dict, key: str) -> str:
    return str(int(span.get(key, 0)))


def _span(s: dict) -> dict:
    out = {"traceId": s.get("traceId", "").lower(), "spanId": s.get("spanId", "").lower(),
           "parentSpanId": (s.get("parentSpanId") or "").lower()}
    if s.get("traceState"):
        out["traceState"] = s["traceState"]
    out["name"] = s.get("name", "")
    kind = s.get("kind", 0)
    out["kind"] = kind if isinstance(kind, int) else {"SPAN_KIND_SERVER": 2}.get(kind, 0)
    out["startTimeUnixNano"] = _times(s, "startTimeUnixNano")
    out["endTimeUnixNano"] = _times(s, "endTimeUnixNano")
    if s.get("attributes"):
        out["attributes"] = _attributes(s["attributes"])
    if s.get("events"):
        out["events"] = []
        for e in s["events"]:
            event = {"timeUnixNano": _times(e, "timeUnixNano"), "name": e.get("name", "")}
            if e.get("attributes"):
                event["attributes"] = _attributes(e["attributes"])
            out["events"].append(event)
    status = {k: v for k, v in (s.get("status") or {}).items() if v}
    out["status"] = status
    return out


def _hex(v: str) -> str:
    """A span or trace id of protobuf's JSON form (base64) as OTLP/JSON's (hex)."""
    return base64.b64decode(v).hex() if v else ""


def decode(body: bytes, content_type: str) -> dict:
    """One OTLP/HTTP request body as OTLP/JSON: protobuf (`application/x-protobuf`) or JSON."""
    if "protobuf" not in content_type:
        return json.loads(body)
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = MessageToDict(ExportTraceServiceRequest.FromString(body), use_integers_for_enums=True)
    for rs in request.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = _hex(span[key])
                for link in span.get("links", []):
                    for key in ("traceId", "spanId"):
                        link[key] = _hex(link.get(key, ""))
    return request


def _sunk_spans(body: bytes, content_type: str) -> int:
    """How many spans one OTLP/HTTP request carries, read as cheaply as its encoding allows."""
    if "protobuf" not in content_type:
        return body.count(b'"traceId"')
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(body)
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def normalize(request: dict) -> list:
    """The resourceSpans of one OTLP request (as OTLP/JSON), in the Collector's JSON form."""
    out = []
    for rs in request.get("resourceSpans", []):
        resource = {"attributes": _attributes((rs.get("resource") or {}).get("attributes", []))}
        scopes = []
        for ss in rs.get("scopeSpans", []):
            scope = {k: v for k, v in (ss.get("scope") or {}).items() if v}
            scopes.append({"scope": scope, "spans": [_span(s) for s in ss.get("spans", [])]})
        out.append({"resource": resource, "scopeSpans": scopes})
    return out


def _count(resource_spans: list) -> int:
    return sum(len(ss["spans"]) for rs in resource_spans for ss in rs["scopeSpans"])


class Collector:
    """The receiver, batch processor and file exporter, on `port`, writing `path`."""

    def __init__(self, port: int = 10000, path="collected_traces.json", send_batch_size: int = 10,
                 timeout: float = 10.0, host: str = "0.0.0.0", sink: bool = False):
        self.path = Path(path)
        self.sink = sink
        # What sink mode received; `router_requests`: OTLP requests naming the service mesh-router.
        self.sunk = {"requests": 0, "bytes": 0, "spans": 0, "router_requests": 0}
        self.send_batch_size, self.timeout = send_batch_size, timeout
        self.pending: list = []
        self.requests = 0  # OTLP requests received
        self.lock = threading.Lock()
        self.due = time.monotonic() + timeout
        self.stopping = threading.Event()
        self.connections: set = set()  # kept-alive connections, closed by stop()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the Collector's receiver: one connection serves many exports
            # The answer's head and body are two writes: without this, Nagle holds the body until the
            # exporter's delayed ACK (40 ms), which a kept connection pays on every export.
            disable_nagle_algorithm = True

            def setup(self):
                super().setup()
                with collector.lock:
                    collector.connections.add(self.connection)
                    if collector.stopping.is_set():  # accepted as stop() ran: closed as the others
                        self.connection.shutdown(socket.SHUT_RDWR)

            def finish(self):
                super().finish()
                with collector.lock:
                    collector.connections.discard(self.connection)

            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/v1/traces":
                    return self._answer(404, b'{"message":"not found"}')
                kind = self.headers.get("Content-Type", "")
                if "json" not in kind and "protobuf" not in kind:
                    return self._answer(415, b'{"message":"this stand-in takes OTLP/HTTP protobuf or JSON"}')
                if collector.sink:
                    try:
                        spans = _sunk_spans(body, kind)
                    except DecodeError as e:
                        return self._answer(400, json.dumps({"message": str(e)}).encode())
                    with collector.lock:
                        collector.sunk["requests"] += 1
                        collector.sunk["bytes"] += len(body)
                        collector.sunk["spans"] += spans
                        collector.sunk["router_requests"] += b"mesh-router" in body
                    return self._answer(200, b"{}")
                try:
                    received = normalize(decode(body, kind))
                except (ValueError, AttributeError, TypeError, DecodeError) as e:
                    return self._answer(400, json.dumps({"message": str(e)}).encode())
                collector.receive(received)
                self._answer(200, b"{}")

            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path != "/stats":
                    return self._answer(404, b'{"message":"not found"}')
                with collector.lock:
                    self._answer(200, json.dumps(collector.sunk).encode())

            def _answer(self, status, body):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True

    def start(self) -> "Collector":
        self.path.write_text("")  # the file exporter truncates its file when it starts
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        threading.Thread(target=self._timer, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stops listening and closes the exporters' kept connections (a collector started
        later on this port gets their next exports, not this one)."""
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            for connection in list(self.connections):
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def receive(self, resource_spans: list) -> None:
        with self.lock:
            self.requests += 1
            self.pending.extend(resource_spans)
            if _count(self.pending) >= self.send_batch_size:
                self._send()

    def _timer(self) -> None:
        while not self.stopping.wait(0.05):
            with self.lock:
                if time.monotonic() >= self.due:
                    if self.pending:
                        self._send()
                    else:
                        self.due = time.monotonic() + self.timeout

    def _send(self) -> None:
        line = json.dumps({"resourceSpans": self.pending}, separators=(",", ":"))
        with self.path.open("a") as f:
            f.write(line + "\n")
        self.pending = []
        self.due = time.monotonic() + self.timeout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=10000)
    p.add_argument("--path", default="collected_traces.json")
    p.add_argument("--send-batch-size", type=int, default=10)
    p.add_argument("--timeout", type=float, default=10.0)
    p.add_argument("--config", help="ignored: otelcol's flag, accepted so the stand-in runs in its place")
    p.add_argument("--sink", action="store_true", help="only count what arrives (GET /stats); write nothing")
    a = p.parse_args()
    Collector(a.port, a.path, a.send_batch_size, a.timeout, sink=a.sink).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
