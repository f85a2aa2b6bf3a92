"""A real etcd server (Debian's etcd-server package) for the tests of several routers: started on
free loopback ports with its own data directory, and stopped, frozen (SIGSTOP) or killed on demand.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from mesh_util import HOST, free_ports


def etcd_binary() -> str | None:
    return shutil.which("etcd") or next((p for p in ("/usr/bin/etcd", "/usr/sbin/etcd") if os.path.exists(p)), None)


def require_etcd() -> None:
    """Skips the test without etcd, or fails it when MESH_REQUIRE_SERVER=1 (as CI runs)."""
    import pytest
    if etcd_binary() is None:
        why = "etcd is not installed (scripts/setup.sh installs Debian's etcd-server)"
        if os.environ.get("MESH_REQUIRE_SERVER") == "1":
            pytest.fail(why)
        pytest.skip(why)


def _free_tcp_port() -> int:
    return free_ports(1)[0]


class Etcd:
    """One etcd member on loopback (a cluster of one is enough: the tests fault the routers, and make
    etcd itself unreachable by freezing it)."""

    def __init__(self, data_dir: Path, log_path: Path, tls: tuple[Path, Path, Path] | None = None):
        """`tls`: (CA, certificate, key): clients over https with a certificate of that CA."""
        self.binary = etcd_binary()
        self.data_dir, self.log_path = Path(data_dir), Path(log_path)
        self.proc: subprocess.Popen | None = None
        self.client_port = self.peer_port = 0
        self.tls = tls

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://{HOST}:{self.client_port}"

    def start(self, timeout: float = 30.0) -> "Etcd":
        if self.client_port == 0:  # a restart keeps its ports and data
            self.client_port, self.peer_port = _free_tcp_port(), _free_tcp_port()
        peer = f"http://{HOST}:{self.peer_port}"
        cmd = [self.binary, "--name", "m0", "--data-dir", str(self.data_dir),
               "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"m0={peer}", "--initial-cluster-state", "new"]
        if self.tls:
            ca, cert, key = self.tls
            cmd += ["--cert-file", str(cert), "--key-file", str(key), "--trusted-ca-file", str(ca),
                    "--client-cert-auth"]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; see {self.log_path}")
            if self.healthy():
                return self
            time.sleep(0.1)
        raise RuntimeError(f"etcd not healthy within {timeout}s; see {self.log_path}")

    def healthy(self) -> bool:
        context = None
        if self.tls:
            import ssl
            ca, cert, key = self.tls
            context = ssl.create_default_context(cafile=str(ca))
            context.load_cert_chain(str(cert), str(key))
        try:
            with urllib.request.urlopen(f"{self.endpoint}/health", timeout=1, context=context) as r:
                return b"true" in r.read()
        except OSError:
            return False

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.thaw()
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(5)
