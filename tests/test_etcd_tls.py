"""Routers reach etcd over TLS (issue 24, item 4): etcd serves https and asks clients for a
certificate of the cluster CA; a router given --etcd-ca, --etcd-cert and --etcd-key leads, one
without a trusted certificate never does (and says why), and bad flag combinations stop the start.
"""
from __future__ import annotations

import subprocess
import time

import pytest

from cluster_util import copy_models, log_has, wait_until
from etcd_util import Etcd, require_etcd

pytestmark = [pytest.mark.server, pytest.mark.cluster]


@pytest.fixture
def tls_etcd(cluster_certs, tmp_path):
    require_etcd()
    res = cluster_certs.ops_run("certs", "issue", str(cluster_certs.dir), "etcd-server", "--role", "server",
                                  "--ip", "127.0.0.1")
    assert res.returncode == 0, res.stderr
    d = cluster_certs.dir
    e = Etcd(tmp_path / "etcd", tmp_path / "etcd.log", tls=(d / "ca.pem", d / "etcd-server.pem", d / "etcd-server.key"))
    e.start()
    yield e
    e.stop()


# The leader's lease: long enough that a router or etcd stalled a moment by a loaded machine keeps it.
LEASE_S = "5"


def role(router) -> dict:
    return router.view()["router"]["lead"]


def test_a_router_leads_through_etcd_over_mutual_tls(cluster_factory, cluster_certs, tls_etcd, models_dir, tmp_path):
    d = cluster_certs.dir
    cluster_certs.issue("etcd-client", "client")
    repo = copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])
    c = cluster_factory()
    trusted = c.start_router([repo], ["--etcd-endpoints", tls_etcd.endpoint, "--etcd-lease-secs", LEASE_S,
                                      "--etcd-ca", str(d / "ca.pem"), "--etcd-cert", str(d / "etcd-client.pem"),
                                      "--etcd-key", str(d / "etcd-client.key"), "--router-name", "r-tls"],
                             name="trusted")
    wait_until(lambda: role(trusted)["role"] == "leader", 60, lambda: f"the trusted router to lead: {role(trusted)}")

    # Without a client certificate etcd refuses the router: it never leads or follows.
    untrusted = c.start_router([repo], ["--etcd-endpoints", tls_etcd.endpoint, "--etcd-lease-secs", LEASE_S,
                                        "--etcd-ca", str(d / "ca.pem"), "--router-name", "r-anon"],
                               name="untrusted")
    # It tried and says why it cannot decide; then, for a while, it still neither leads nor follows.
    wait_until(lambda: log_has(untrusted, r"etcd: .*placement waits"), 60,
               lambda: f"the untrusted router to say etcd refuses it:\n{untrusted.log_tail(20)}")
    time.sleep(5)
    assert role(untrusted)["role"] == "unknown", role(untrusted)
    assert role(trusted)["role"] == "leader"


def test_etcd_flag_combinations_are_checked(cluster_bins, cluster_certs, tmp_path):
    d = cluster_certs.dir
    for args, words in (
        (["--etcd-endpoints", "http://127.0.0.1:1", "--etcd-ca", str(d / "ca.pem")], "must be https://"),
        (["--etcd-endpoints", "https://127.0.0.1:1", "--etcd-cert", str(d / "ca.pem")], "need --etcd-ca"),
        (["--etcd-endpoints", "https://127.0.0.1:1", "--etcd-user", "root"], "go together"),
        (["--etcd-endpoints", "https://127.0.0.1:1", "--etcd-ca", str(tmp_path / "missing.pem")], "missing.pem"),
    ):
        r = subprocess.run([str(cluster_bins["router"]), "--cluster-insecure-dev", "--http-port", "0",
                            "--grpc-port", "0", "--metrics-port", "0", "--cluster-port", "0", *args],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode != 0, (args, r.stderr[-1000:])
        assert words in r.stdout + r.stderr, (args, (r.stdout + r.stderr)[-1000:])
