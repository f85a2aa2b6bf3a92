"""Hosts you can break (issue 9): Linux network namespaces joined by veth pairs to a bridge in a hub
namespace that the harness creates, each a "host" with its own address, plus one interface of the
test process's own namespace on the bridge so the tests reach every host directly.

Only the harness's own namespaces are touched (all named with its prefix), and `close()` deletes
them and kills what ran in them, also after a failure (the fixtures call it, and so does atexit).
A host's link can be cut and healed (a partition: its bridge-side link down), one direction at a
time is left to `mesh-ops chaos relay`. Needs root and `ip`; `unavailable()` says why not in one line.
"""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import time
from pathlib import Path


def _ip(*args: str, check=True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespace tests need root"
    if shutil.which("ip") is None:
        return "network namespace tests need the `ip` tool (iproute2)"
    probe = f"meshprobe{os.getpid()}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"cannot create a network namespace: {r.stderr.strip()}"
    # Entering one (`ip -n`) also needs "/" to be a mount point (a bare chroot's is not).
    entered = _ip("-n", probe, "link", "show", check=False)
    _ip("netns", "del", probe, check=False)
    if entered.returncode != 0:
        return f"cannot enter a network namespace: {entered.stderr.strip()}"
    return None


class Host:
    """One namespace: its address on the bridge, and the processes started in it."""

    def __init__(self, net: "Network", name: str, index: int):
        self.net, self.name, self.index = net, name, index
        self.ns = f"{net.prefix}{name}"
        self.addr = f"{net.subnet}.{index}"
        self.bridge_side = f"{net.prefix}{index}b"
        self.procs: list[subprocess.Popen] = []

    def popen(self, cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
        """Starts `cmd` inside this host, its output appended to `log`."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            out.write(f"\n==== {time.strftime('%H:%M:%S')} [{self.name} {self.addr}] $ {' '.join(cmd)}\n".encode())
            p = subprocess.Popen(["ip", "netns", "exec", self.ns, *cmd], stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(p)
        return p

    def cut(self) -> None:
        """Partitions the host: its link to the bridge goes down (both directions)."""
        _ip("-n", self.net.hub, "link", "set", self.bridge_side, "down")

    def heal(self) -> None:
        _ip("-n", self.net.hub, "link", "set", self.bridge_side, "up")


class Network:
    """A bridge in a hub namespace, hosts on it, and the test process's own namespace on it too."""

    def __init__(self, tag: str = "m"):
        # Short, unique per run: interface names are at most 15 characters.
        self.prefix = f"{tag}{os.getpid() % 100000}"
        self.subnet = f"10.{77 + os.getpid() % 100}.{os.getpid() // 100 % 250}"
        self.hub = f"{self.prefix}hub"
        # The test process's interface on the bridge (its end stays in this namespace).
        self.local_if = f"{self.prefix}t"
        self.hosts: dict[str, Host] = {}
        self.closed = False
        atexit.register(self.close)
        try:
            self._make_hub()
        except subprocess.CalledProcessError as e:
            self.close()
            raise RuntimeError(f"cannot make the test network: {' '.join(e.cmd)}: {e.stderr.strip()}") from e

    def _make_hub(self) -> None:
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        _ip("link", "add", self.local_if, "type", "veth", "peer", "name", "tb", "netns", self.hub)
        _ip("-n", self.hub, "link", "set", "tb", "master", "br0", "up")
        _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.local_if)
        _ip("link", "set", self.local_if, "up")

    def add(self, name: str) -> Host:
        h = Host(self, name, len(self.hosts) + 1)
        _ip("netns", "add", h.ns)
        _ip("link", "add", "eth0", "netns", h.ns, "type", "veth", "peer", "name", h.bridge_side, "netns", self.hub)
        _ip("-n", self.hub, "link", "set", h.bridge_side, "master", "br0", "up")
        _ip("-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", "eth0")
        _ip("-n", h.ns, "link", "set", "eth0", "up")
        _ip("-n", h.ns, "link", "set", "lo", "up")
        self.hosts[name] = h
        return h

    def close(self) -> None:
        """Kills every process the hosts started and deletes every namespace of this network."""
        if self.closed:
            return
        self.closed = True
        for h in self.hosts.values():
            for p in h.procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, 9)
                    except ProcessLookupError:
                        pass
            for p in h.procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    pass
            _ip("netns", "del", h.ns, check=False)
        _ip("link", "del", self.local_if, check=False)
        _ip("netns", "del", self.hub, check=False)

    def leftovers(self) -> list[str]:
        """Namespaces of this network that still exist (none after close())."""
        listed = _ip("netns", "list", check=False).stdout.split()
        return [n for n in listed if n.startswith(self.prefix)]
