"""The multi-host deployment configs (configs/k8s, configs/systemd), checked offline.

- Every Kubernetes manifest validates against Kubernetes 1.33's schemas in strict mode
  (`kubernetes-validate`; unknown fields fail), and kustomization.yaml lists them all.
- Every flag the manifests and systemd units pass is one the real binaries accept: its name is in
  `--help`, and the whole argument list parses (clap checks every value before printing the help
  that a trailing `--help` asks for).
- The wiring: every node joins every router replica by a name the router's headless Service
  gives it, nodes request a GPU and pass --gpus, probes hit the KServe health endpoints on the HTTP
  port, Prometheus annotations name the metrics port, certificate paths lie in the mounted Secrets,
  the cache and the repository are the volumes they should be, and the stop timeouts cover the
  drain.
- The systemd units pass `systemd-analyze verify` (when it is installed) and their env files define
  every variable they use.

The flag checks need target/release/mesh-{node,router,ops} (or MESH_*_BIN); they are skipped
without them, or fail with MESH_REQUIRE_SERVER=1.
"""
from __future__ import annotations

import copy
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
K8S_DIR = REPO_ROOT / "configs" / "k8s"
SYSTEMD_DIR = REPO_ROOT / "configs" / "systemd"
K8S_VERSION = "1.33.0"
NAMESPACE = "mesh"
EXAMPLE_SECRETS = "certs-secret.example.yaml"  # not in kustomization.yaml on purpose
BINARIES = ("mesh-router", "mesh-node")


# The flag values of a router or node when the container does not set them (their --help defaults).
DEFAULTS = {"--http-port": "8000", "--grpc-port": "8001", "--metrics-port": "8002",
            "--cluster-port": "8003", "--exit-timeout-secs": "30"}


# --------------------------------------------------------------------------
# Manifests
# --------------------------------------------------------------------------

def manifest_files() -> list[Path]:
    return sorted(p for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")


def load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def applied() -> list[dict]:
    """The objects `kubectl apply -k configs/k8s` creates."""
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    return [d for name in kustomization["resources"] for d in load(K8S_DIR / name)]


def find(kind: str, name: str | None = None) -> list[dict]:
    return [d for d in applied() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(kind: str, name: str) -> dict:
    found = find(kind, name)
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def workloads() -> list[dict]:
    return [d for d in applied() if d["kind"] in ("StatefulSet", "Deployment", "DaemonSet")]


def binary_of(container: dict) -> str:
    cmd = container.get("command") or container.get("args") or [""]
    return Path(cmd[0]).name


def mesh_workload(binary: str) -> tuple[dict, dict]:
    """The one workload running `binary`, and its container."""
    found = [(w, c) for w in workloads() for c in w["spec"]["template"]["spec"]["containers"]
             if binary_of(c) == binary]
    assert len(found) == 1, f"expected one workload running {binary}, found {len(found)}"
    return found[0]


def parse_flags(tokens: list[str]) -> list[tuple[str, str | None]]:
    """(flag, value) pairs from `--flag=value` or `--flag value` tokens."""
    out, i = [], 0
    while i < len(tokens):
        t = tokens[i]
        assert t.startswith("--"), f"unexpected argument {t!r} in {tokens}"
        if "=" in t:
            flag, value = t.split("=", 1)
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            flag, value = t, tokens[i + 1]
            i += 1
        else:
            flag, value = t, None
        out.append((flag, value))
        i += 1
    return out


def values(container: dict, flag: str) -> list[str]:
    return [v for f, v in parse_flags(container.get("args", [])) if f == flag]


def value(container: dict, flag: str) -> str:
    found = values(container, flag)
    assert len(found) <= 1, f"{flag} given {len(found)} times"
    if not found:
        assert flag in DEFAULTS, f"{container['name']} has no {flag}"
        return DEFAULTS[flag]
    return found[0]


def expand(text: str, container: dict, pod_name: str) -> str:
    """Kubernetes' $(VAR) expansion for the pod named `pod_name`."""
    env = {}
    for e in container.get("env", []):
        field = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        env[e["name"]] = pod_name if field == "metadata.name" else e.get("value", "")
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], text)


def container_port(container: dict, port, protocol: str = "TCP") -> int:
    """The containerPort a probe or Service names (by name or number), with its protocol."""
    for p in container.get("ports", []):
        if (p.get("name") == port or p["containerPort"] == port) and p.get("protocol", "TCP") == protocol:
            return p["containerPort"]
    raise AssertionError(f"{container['name']} exposes no {protocol} port {port!r}")


def volume_at(workload: dict, container: dict, path: str) -> dict:
    """The pod volume mounted at the directory holding `path` (or at `path` itself)."""
    spec = workload["spec"]["template"]["spec"]
    mounts = [m for m in container.get("volumeMounts", [])
              if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mounts, f"{path} is on no volume of {container['name']}"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    named = [v for v in spec.get("volumes", []) + [{"name": t["metadata"]["name"], "pvcTemplate": t}
             for t in workload["spec"].get("volumeClaimTemplates", [])] if v["name"] == mount["name"]]
    assert len(named) == 1, f"volume {mount['name']} is not defined once"
    return {**named[0], "mount": mount}


def replicas_names(workload: dict) -> list[str]:
    assert workload["kind"] == "StatefulSet", f"{workload['metadata']['name']} needs stable pod names"
    return [f"{workload['metadata']['name']}-{i}" for i in range(workload["spec"].get("replicas", 1))]


def selects(service: dict, workload: dict) -> bool:
    labels = workload["spec"]["template"]["metadata"].get("labels", {})
    return all(labels.get(k) == v for k, v in service["spec"].get("selector", {}).items())


# --------------------------------------------------------------------------
# Schema validation
# --------------------------------------------------------------------------

@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.name)
def test_manifest_validates_strictly(path):
    docs = load(path)
    assert docs, f"{path.name} holds no object"
    for doc in docs:
        what = f"{path.name}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{what} is invalid at {'.'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            pytest.fail(f"{what}: {e.message}")


def test_strict_validation_rejects_what_kubernetes_would():
    """The validator is not vacuous: an unknown field, a wrong type and a missing required field
    in the router's StatefulSet each fail."""
    sts = one("StatefulSet", "mesh-router")
    kubernetes_validate.validate(sts, K8S_VERSION, strict=True)
    unknown = copy.deepcopy(sts)
    unknown["spec"]["template"]["spec"]["containers"][0]["argz"] = ["--http-port=8000"]
    wrong_type = copy.deepcopy(sts)
    wrong_type["spec"]["replicas"] = "two"
    missing = copy.deepcopy(sts)
    del missing["spec"]["selector"]
    for broken in (unknown, wrong_type, missing):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S_DIR / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    assert kustomization.get("namespace") == NAMESPACE
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed)), "a resource is listed twice"
    expected = {p.name for p in manifest_files()} - {EXAMPLE_SECRETS}
    assert set(listed) == expected, "kustomization.yaml resources differ from the manifests"
    for doc in applied():
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == NAMESPACE
        else:
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{doc['kind']} outside {NAMESPACE}"
    # The placeholder Secrets are never applied; the workloads mount Secrets of those names.
    assert not find("Secret"), "Secrets with placeholder keys must not be applied"


# --------------------------------------------------------------------------
# Flags against the real binaries
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def help_flags(cluster_bins) -> dict[str, set[str]]:
    """Each binary's flags, read from its --help."""
    out = {}
    for name, key in (("mesh-router", "router"), ("mesh-node", "node")):
        text = subprocess.run([str(cluster_bins[key]), "--help"], capture_output=True, text=True,
                              check=True, timeout=30).stdout
        out[name] = set(re.findall(r"^\s*(?:-\w, )?(--[a-z0-9][a-z0-9-]*)", text, re.M))
        assert "--help" in out[name] and len(out[name]) > 10, f"cannot read {name} --help"
    return out


def check_args(tokens: list[str], binary: str, help_flags, cluster_bins, where: str):
    """Every flag in `tokens` is one `binary` knows, and the list parses."""
    unknown = [f for f, _ in parse_flags(tokens) if f not in help_flags[binary]]
    assert not unknown, f"{where}: {binary} has no {unknown}"
    known = []
    for flag, val in parse_flags(tokens):
        known += [flag] if val is None else [f"{flag}={val}"]
    bin_path = cluster_bins["router" if binary == "mesh-router" else "node"]
    run = subprocess.run([str(bin_path), *known, "--help"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, f"{where}: {binary} refuses its arguments {known}:\n{run.stderr}"


@pytest.mark.parametrize("binary", BINARIES)
def test_manifest_flags_are_the_binaries(binary, help_flags, cluster_bins):
    workload, container = mesh_workload(binary)
    for pod in replicas_names(workload):
        args = [expand(a, container, pod) for a in container.get("args", [])]
        check_args(args, binary, help_flags, cluster_bins, f"{workload['metadata']['name']} ({pod})")


def test_env_references_are_defined():
    """Kubernetes leaves an undefined $(VAR) in command or args as literal text."""
    for w in workloads():
        for c in w["spec"]["template"]["spec"]["containers"]:
            defined = {e["name"] for e in c.get("env", [])}
            for arg in c.get("command", []) + c.get("args", []):
                missing = set(re.findall(r"\$\(([^)]*)\)", arg)) - defined
                assert not missing, f"{c['name']}: {arg} uses undefined {missing}"


# --------------------------------------------------------------------------
# Wiring
# --------------------------------------------------------------------------

def test_every_node_joins_every_router():
    router, rc = mesh_workload("mesh-router")
    node, nc = mesh_workload("mesh-node")
    cluster_port = int(value(rc, "--cluster-port"))
    assert container_port(rc, cluster_port, "UDP") == cluster_port, "the cluster port is UDP (QUIC)"
    headless = one("Service", router["spec"]["serviceName"])
    assert headless["spec"].get("clusterIP") == "None", "per-router names need a headless Service"
    assert headless["spec"].get("publishNotReadyAddresses") is True, \
        "a router is ready only after nodes joined it: its name must resolve before"
    assert selects(headless, router)
    assert any(p["port"] == cluster_port and p.get("protocol") == "UDP" for p in headless["spec"]["ports"])
    domain = f"{headless['metadata']['name']}.{NAMESPACE}.svc"
    expected = [f"{pod}.{domain}:{cluster_port}" for pod in replicas_names(router)]
    joins = values(nc, "--cluster-join")
    assert len(joins) == len(set(joins)), f"a router is joined twice: {joins}"
    assert sorted(joins) == sorted(expected), \
        f"{len(expected)} router replicas but the nodes join {joins} (need one per replica: {expected})"


def test_nodes_request_a_gpu_and_pass_gpus():
    _, c = mesh_workload("mesh-node")
    limits = c["resources"]["limits"]
    gpus = int(limits.get("nvidia.com/gpu", 0))
    assert gpus >= 1, "nodes must request nvidia.com/gpu in resources.limits"
    # The device plugin renumbers the granted GPUs from 0 inside the container.
    assert value(c, "--gpus").split(",") == [str(i) for i in range(gpus)]


@pytest.mark.parametrize("binary", BINARIES)
def test_probes_hit_kserve_health_on_the_http_port(binary):
    _, c = mesh_workload(binary)
    http_port = int(value(c, "--http-port"))
    for probe, path in (("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live")):
        get = c.get(probe, {}).get("httpGet")
        assert get, f"{binary} has no HTTP {probe}"
        assert get["path"] == path
        assert container_port(c, get["port"]) == http_port, f"{binary} {probe} is not on --http-port"


@pytest.mark.parametrize("binary", BINARIES)
def test_prometheus_annotations_name_the_metrics_port(binary):
    w, c = mesh_workload(binary)
    notes = w["spec"]["template"]["metadata"].get("annotations", {})
    assert notes.get("prometheus.io/scrape") == "true"
    assert notes.get("prometheus.io/path") == "/metrics"
    metrics_port = int(value(c, "--metrics-port"))
    assert container_port(c, int(notes.get("prometheus.io/port", 0))) == metrics_port


def test_clients_reach_routers_through_one_service():
    router, rc = mesh_workload("mesh-router")
    svc = one("Service", "mesh-router")
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP" and svc["spec"].get("clusterIP") != "None"
    assert selects(svc, router)
    ports = {p["name"]: p for p in svc["spec"]["ports"]}
    for name, flag in (("http", "--http-port"), ("grpc", "--grpc-port"), ("metrics", "--metrics-port")):
        assert name in ports, f"the client Service has no {name} port"
        assert container_port(rc, ports[name]["targetPort"]) == int(value(rc, flag))
        assert ports[name]["port"] == int(DEFAULTS[flag]), f"clients expect {name} on {DEFAULTS[flag]}"


def test_every_service_selects_pods_with_its_ports():
    for svc in find("Service"):
        targets = [w for w in workloads() if selects(svc, w)]
        assert svc["spec"].get("selector") and targets, f"Service {svc['metadata']['name']} selects nothing"
        for p in svc["spec"]["ports"]:
            for w in targets:
                c = w["spec"]["template"]["spec"]["containers"][0]
                container_port(c, p.get("targetPort", p["port"]), p.get("protocol", "TCP"))


@pytest.mark.parametrize("binary", BINARIES)
def test_certificates_come_from_the_secret(binary):
    w, c = mesh_workload(binary)
    assert "--cluster-insecure-dev" not in dict(parse_flags(c.get("args", []))), "certificates, not dev mode"
    examples = {d["metadata"]["name"]: d for d in load(K8S_DIR / EXAMPLE_SECRETS)}
    secret_names = set()
    for pod in replicas_names(w):
        for flag in ("--cluster-ca", "--cluster-cert", "--cluster-key"):
            path = expand(value(c, flag), c, pod)
            vol = volume_at(w, c, path)
            assert "secret" in vol, f"{binary} {flag} {path} is not on a Secret volume"
            name = vol["secret"]["secretName"]
            secret_names.add(name)
            assert name in examples, f"{EXAMPLE_SECRETS} does not show Secret {name}"
            key = path[len(vol["mount"]["mountPath"].rstrip("/")) + 1:]
            assert key in examples[name]["stringData"], f"Secret {name} has no key {key} for {pod}"
            if flag == "--cluster-cert" and binary == "mesh-node":
                assert key == f"{expand(value(c, '--node-name'), c, pod)}.pem", \
                    "a node's certificate is issued under its --node-name"
    assert len(secret_names) == 1


def test_node_cache_is_an_emptydir_and_routers_mount_the_repository():
    node, nc = mesh_workload("mesh-node")
    assert "emptyDir" in volume_at(node, nc, value(nc, "--cluster-cache"))
    assert not values(nc, "--model-repository"), "nodes get their models from the routers"
    router, rc = mesh_workload("mesh-router")
    repos = values(rc, "--model-repository")
    assert repos, "routers need the cluster repository"
    for repo in repos:
        vol = volume_at(router, rc, repo)
        assert vol["mount"].get("readOnly") is True
        if "persistentVolumeClaim" in vol:
            one("PersistentVolumeClaim", vol["persistentVolumeClaim"]["claimName"])
        else:
            assert "configMap" in vol, f"the repository {repo} is neither a PVC nor a ConfigMap"


def test_routers_share_placement_through_every_etcd_member():
    etcd, ec = mesh_workload("etcd")
    assert ec["image"] == "quay.io/coreos/etcd:v3.4.23"
    svc = one("Service", etcd["spec"]["serviceName"])
    assert svc["spec"].get("clusterIP") == "None" and svc["spec"].get("publishNotReadyAddresses") is True
    members = replicas_names(etcd)
    assert len(members) % 2 == 1, "an even number of etcd members adds no fault tolerance"
    domain = f"{svc['metadata']['name']}.{NAMESPACE}.svc"
    client_port = int(value(ec, "--listen-client-urls").rsplit(":", 1)[1])
    peer_port = int(value(ec, "--listen-peer-urls").rsplit(":", 1)[1])
    initial = dict(m.split("=", 1) for m in value(ec, "--initial-cluster").split(","))
    assert initial == {m: f"http://{m}.{domain}:{peer_port}" for m in members}
    for m in members:
        assert expand(value(ec, "--name"), ec, m) == m
        assert expand(value(ec, "--advertise-client-urls"), ec, m) == f"http://{m}.{domain}:{client_port}"
        assert expand(value(ec, "--initial-advertise-peer-urls"), ec, m) == initial[m]
    _, rc = mesh_workload("mesh-router")
    endpoints = value(rc, "--etcd-endpoints").split(",")
    assert sorted(endpoints) == sorted(f"http://{m}.{domain}:{client_port}" for m in members)


@pytest.mark.parametrize("binary,drain_steps", [("mesh-router", 1), ("mesh-node", 3)], ids=BINARIES)
def test_grace_period_covers_the_drain(binary, drain_steps):
    w, c = mesh_workload(binary)
    grace = w["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    assert grace > drain_steps * int(value(c, "--exit-timeout-secs"))


def test_image_placeholder_is_documented():
    images = {mesh_workload(b)[1]["image"] for b in BINARIES}
    assert len(images) == 1, f"routers and nodes should run one image, not {images}"
    assert images.pop() in (K8S_DIR / "README.md").read_text()


# --------------------------------------------------------------------------
# systemd
# --------------------------------------------------------------------------

UNITS = {"mesh-router.service": "mesh-router", "mesh-node.service": "mesh-node",
         "mesh-node@.service": "mesh-node"}
INSTANCE, HOST = "0", "gpu-host-1"


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections of a unit file: key -> every value (keys such as EnvironmentFile= repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current, pending = None, ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None and "=" in line, f"{path.name}: cannot parse {line!r}"
        key, val = line.split("=", 1)
        current.setdefault(key.strip(), []).append(val.strip())
    return sections


def specifiers(text: str) -> str:
    return text.replace("%i", INSTANCE).replace("%l", HOST).replace("%%", "%")


def unit_env(unit: dict) -> dict[str, str]:
    """What the service's environment holds: Environment=, then each EnvironmentFile= (example)."""
    env = {}
    for item in unit["Service"].get("Environment", []):
        for assignment in shlex.split(specifiers(item)):
            k, v = assignment.split("=", 1)
            env[k] = v
    for name in unit["Service"].get("EnvironmentFile", []):
        example = SYSTEMD_DIR / Path(specifiers(name.lstrip("-"))).name
        assert example.is_file(), f"no example {example.name} for EnvironmentFile={name}"
        for line in example.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                k, v = line.split("=", 1)
                env[k.strip()] = v.strip().strip('"')
    return env


def exec_start(unit: dict) -> list[str]:
    """ExecStart= as systemd runs it: ${VAR} is one word, $VAR splits on whitespace."""
    (line,) = unit["Service"]["ExecStart"]
    env = unit_env(unit)
    words = []
    for token in shlex.split(specifiers(line).lstrip("-@:+!")):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", token)
        if whole:
            assert whole.group(1) in env, f"${whole.group(1)} is set nowhere"
            words += env[whole.group(1)].split()
            continue

        def braced(m):
            assert m.group(1) in env, f"${{{m.group(1)}}} is set nowhere"
            assert env[m.group(1)], f"${{{m.group(1)}}} is empty: it would be an empty argument"
            return env[m.group(1)]
        words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", braced, token))
    return words


@pytest.mark.parametrize("name", UNITS)
def test_systemd_unit_settings(name):
    unit = parse_unit(SYSTEMD_DIR / name)
    svc = unit["Service"]
    argv = exec_start(unit)
    assert argv[0] == f"/usr/local/bin/{UNITS[name]}"
    assert svc["Restart"] == ["on-failure"]
    assert svc["KillSignal"] == ["SIGTERM"]
    assert svc["NoNewPrivileges"] == ["yes"] and svc["ProtectSystem"] == ["strict"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    flags = dict(parse_flags(argv[1:]))
    steps = 3 if UNITS[name] == "mesh-node" else 1
    assert int(svc["TimeoutStopSec"][0]) > steps * int(flags.get("--exit-timeout-secs", "30"))
    if UNITS[name] == "mesh-node":
        cache = flags["--cluster-cache"]
        writable = [specifiers(p) for v in svc.get("ReadWritePaths", []) for p in v.split()]
        assert cache in writable, f"{name}: the cache {cache} is not in ReadWritePaths"
        assert "--gpus" in flags


@pytest.mark.parametrize("name", UNITS)
def test_systemd_units_pass_the_flags_the_manifests_do(name, help_flags, cluster_bins):
    binary = UNITS[name]
    argv = exec_start(parse_unit(SYSTEMD_DIR / name))
    check_args(argv[1:], binary, help_flags, cluster_bins, name)
    _, c = mesh_workload(binary)
    assert {f for f, _ in parse_flags(argv[1:])} == {f for f, _ in parse_flags(c["args"])}, \
        f"{name} and the {binary} manifest pass different flags"


def test_systemd_units_verify(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if not analyze:
        pytest.skip("systemd-analyze is not installed (the settings are still checked above)")
    names = []
    for name, binary in UNITS.items():
        # verify insists that ExecStart exists; an instance stands for the template.
        target = tmp_path / name.replace("@.", f"@{INSTANCE}.")
        target.write_text((SYSTEMD_DIR / name).read_text()
                          .replace(f"/usr/local/bin/{binary}", shutil.which("true") or "/bin/true"))
        names.append(str(target))
    run = subprocess.run([analyze, "verify", "--man=no", *names], capture_output=True, text=True,
                         timeout=60)
    ours = [line for line in (run.stdout + run.stderr).splitlines() if str(tmp_path) in line
            or any(Path(n).name in line for n in names)]
    assert run.returncode == 0 and not ours, "\n".join(ours) or run.stderr
