"""Slow and idle HTTP clients cannot hold the port (issue 24, item 3), against a real mesh-node:

- a client that sends half a request head and stops is disconnected after --http-header-timeout-secs;
- one that sends a head and too little body gets 400 naming --http-body-timeout-secs;
- past --http-max-connections, a new connection waits in the backlog (not answered) until one of
  the held ones closes, and is answered then.
"""
from __future__ import annotations

import json
import socket
import time

import pytest

from mesh_util import HOST, http_request

pytestmark = [pytest.mark.server]


def read_all(s: socket.socket, timeout: float) -> bytes:
    """What arrives until the peer closes, or until nothing has arrived for `timeout` s."""
    return read_until_closed(s, timeout)[0]


def read_until_closed(s: socket.socket, timeout: float) -> tuple[bytes, bool]:
    """What arrives until the peer closes (closed: True), or until `timeout` s of silence (False)."""
    s.settimeout(timeout)
    out = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out, True
            out += chunk
    except socket.timeout:
        return out, False
    except ConnectionResetError:
        return out, True


def test_slow_heads_and_bodies_are_cut_off_and_connections_capped(fresh_server, models_dir, tmp_path):
    from cluster_util import copy_models
    repo = copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])
    srv = fresh_server([repo], ["--http-header-timeout-secs", "2", "--http-body-timeout-secs", "2",
                                "--http-max-connections", "4"])
    port = srv.http_port

    # Half a head, then nothing: the server hangs up after the header deadline (2 s; 30 s of
    # silence is the hang guard: a server without the deadline never hangs up).
    s = socket.create_connection((HOST, port))
    started = time.monotonic()
    s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n")
    got, closed = read_until_closed(s, 30)
    took = time.monotonic() - started
    s.close()
    assert closed, "the slow head held its connection for 30 s"
    assert took >= 1.5, f"the slow head was cut off after {took:.1f} s, before the 2 s header deadline"
    assert b"200 OK" not in got

    # A head that promises 1000 bytes of body and sends 10: 400 naming the body deadline.
    s = socket.create_connection((HOST, port))
    s.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1000\r\n\r\n{\"inputs\":")
    got = read_all(s, 30)
    s.close()
    assert b" 400 " in got.split(b"\r\n", 1)[0], got[:200]
    assert b"--http-body-timeout-secs" in got, got[-300:]

    # Four connections held open (each with a request in progress), a fifth waits for a slot.
    held = []
    for _ in range(4):
        h = socket.create_connection((HOST, port))
        h.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"200 OK" in h.recv(4096)
        held.append(h)  # kept alive: each holds its slot
    fifth = socket.create_connection((HOST, port))
    fifth.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert read_all(fifth, 1.0) == b"", "a fifth connection was served past --http-max-connections 4"
    held.pop().close()
    assert b"200 OK" in read_all(fifth, 30), "the waiting connection was not served once a slot freed"
    fifth.close()
    for h in held:
        h.close()
    # And the server is fine.
    r = http_request(port, "GET", "/v2/models/add_sub")
    assert r.status == 200 and json.loads(r.body)["name"] == "add_sub"
