"""Placement by the router (issue 8): a router with a cluster repository and nodes started without
one. The router ships each model's files over the cluster link, the nodes load them, and every
model gets its replicas on distinct nodes; a killed node's models are placed again elsewhere, a
node that joins gets replicas, a drain empties a node, load scales a model up and down, a node too
small for a model never gets it, and the repository extension against the router acts on the
whole cluster. Loads of checked add_sub requests run through the faults: none may fail."""
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cluster_util import AddSubLoad, add_sub_inputs, copy_models, log_has, wait_until
from mesh_util import metric_sum, parse_metrics

pytestmark = [pytest.mark.server, pytest.mark.cluster]

# Test-sized timings: replicas may move 1 s after they are ready; the autoscaler reacts in 1 s up
# and 3 s down; loads that take longer than 30 s failed.
FAST = ["--min-replica-age-ms", "1000", "--scale-up-delay-ms", "1000", "--scale-down-delay-ms", "3000",
        "--load-timeout-ms", "30000", "--target-inflight", "1"]
# A hang guard on re-placement, far above the measured time (printed; benches/ records it).
REPLACE_GUARD_S = 60.0


def with_params(cfg: Path, **params) -> None:
    """Appends `parameters { key: "mesh.<k>" ... }` entries to a config.pbtxt."""
    text = cfg.read_text()
    for k, v in params.items():
        text += f'\nparameters {{ key: "mesh.{k}" value: {{ string_value: "{v}" }} }}\n'
    cfg.write_text(text)


@pytest.fixture(scope="module")
def cluster_repo(models_dir, tmp_path_factory) -> Path:
    """add_sub and mlp (default bounds: 2 replicas), and sleep_py (1 to 3 replicas)."""
    repo = copy_models(models_dir / "simple", tmp_path_factory.mktemp("placement") / "repo", ["add_sub", "mlp"])
    sleep = copy_models(Path(__file__).parent / "python_models", repo, ["sleep_py"]) / "sleep_py"
    with_params(sleep / "config.pbtxt", min_replicas=1, max_replicas=3)
    return repo


def python_args() -> list[str]:
    return ["--backend-config", f"python,interpreter={sys.executable}"]


def empty_node(c, name, *args, cache: Path | None = None):
    """A node with no repository of its own that joins the router (it serves what is placed)."""
    if cache is None:
        cache = c.log_dir / f"{c.tag}-{name}-cache"
        shutil.rmtree(cache, ignore_errors=True)  # a fresh cache, not an earlier run's
    n = c.start_node(name, [], ["--cluster-cache", str(cache)] + python_args() + list(args), wait_models=[],
                     joined=False)
    wait_until(lambda: c.state(name) == "up", 30, f"{name} to join")
    n.cache = cache
    return n


def placement(c) -> dict:
    return {m["name"]: m for m in c.view()["placement"]["models"]}


def ready_nodes(c, model) -> set[str]:
    m = placement(c).get(model)
    return {r["node"] for r in m["replicas"] if r["state"] == "ready"} if m else set()


def wait_placed(c, model, n, timeout=60.0) -> set[str]:
    return wait_until(lambda: s if len(s := ready_nodes(c, model)) >= n else None, timeout,
                      lambda: f"{n} ready replicas of {model}: {placement(c).get(model)}")


def check_add_sub(url: str, i: int = 7) -> None:
    c = httpclient.InferenceServerClient(url)
    a, b = add_sub_inputs(i)
    ins = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    r = c.infer("add_sub", ins)
    assert np.array_equal(r.as_numpy("OUTPUT0"), a + b)
    c.close()


def ops(c, *args, timeout=120) -> subprocess.CompletedProcess:
    cmd = [str(c.bins["ops"]), *args, "--router", c.router.http_url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cluster(cluster_factory, cluster_repo):
    c = cluster_factory()
    c.start_router([cluster_repo], FAST)
    for name in ("n1", "n2", "n3"):
        empty_node(c, name)
    c.loads = []
    yield c
    for load in c.loads:
        load.abort()


def start_load(c, n=2000) -> AddSubLoad:
    load = AddSubLoad(c.router, concurrency=8, min_requests=n)
    c.loads.append(load)
    return load.start()


def test_empty_nodes_get_every_model_with_its_replicas_on_distinct_nodes(cluster):
    c = cluster
    for model, n in (("add_sub", 2), ("mlp", 2), ("sleep_py", 1)):
        nodes = wait_placed(c, model, n)
        assert len(nodes) == n, f"{model} on {nodes}"  # a set: distinct nodes
    check_add_sub(c.router.http_url)
    rows = {r["name"]: r for r in c.router.index()}
    assert rows["add_sub"]["state"] == "READY", rows["add_sub"]
    view = c.view()
    nodes = {n["name"]: n for n in view["nodes"]}
    placed = sorted(m for n in nodes.values() for m in n["placed"])
    assert placed.count("add_sub") == 2 and placed.count("mlp") == 2, placed
    # Every node that serves add_sub received its files into its own cache, and serves it itself.
    for name in ready_nodes(c, "add_sub"):
        node = c.nodes[name]
        assert list(node.cache.glob("*/add_sub/config.pbtxt")), f"no cached files on {name}"
        assert log_has(node, r"files received from the router.*model=add_sub"), name
        check_add_sub(node.http_url)
    # The router's metrics count the replicas.
    m = parse_metrics(c.router.metrics())
    assert metric_sum(m, "mesh_router_model_replicas", model="add_sub", state="ready") == 2
    out = ops(c, "models")
    assert out.returncode == 0, out.stderr
    assert "add_sub" in out.stdout and "2/2" in out.stdout, out.stdout
    status = ops(c, "status")
    assert "PLACEMENT" in status.stdout and "RECENT EVENTS" in status.stdout, status.stdout


def test_a_killed_node_is_replaced_while_requests_keep_succeeding(cluster):
    c = cluster
    holders = wait_placed(c, "add_sub", 2)
    wait_placed(c, "mlp", 2)
    load = start_load(c)
    load.wait_done(400)
    victim = sorted(holders)[0]
    c.nodes[victim].kill()
    t0 = time.monotonic()
    again = wait_until(lambda: s if len(s := ready_nodes(c, "add_sub") - {victim}) == 2 else None,
                       REPLACE_GUARD_S, lambda: f"add_sub placed again: {placement(c)['add_sub']}")
    took = time.monotonic() - t0
    print(f"\nadd_sub ready on {sorted(again)} {took * 1000:.0f} ms after {victim} was killed")
    wait_until(lambda: len(ready_nodes(c, "mlp") - {victim}) == 2, REPLACE_GUARD_S, "mlp placed again")
    load.wait_done(load.done + 500)
    load.stop()
    print(load.summary())
    load.assert_all_ok()
    events = c.view()["placement"]["events"]
    assert any(e["kind"] == "place" and e["model"] == "add_sub" for e in events), events


def test_a_joining_node_gets_replicas_without_failed_requests(cluster):
    c = cluster
    for model in ("add_sub", "mlp"):
        wait_placed(c, model, 2)
    load = start_load(c)
    load.wait_done(300)
    empty_node(c, "n4")
    # 5 replicas over 4 nodes: the newcomer gets at least one, moved make-before-break.
    wait_until(lambda: any("n4" in ready_nodes(c, m) for m in ("add_sub", "mlp", "sleep_py")), 60,
               lambda: f"a replica on n4: {placement(c)}")
    load.wait_done(load.done + 300)
    load.stop()
    print(load.summary())
    load.assert_all_ok()
    kinds = [e["kind"] for e in c.view()["placement"]["events"]]
    assert "move" in kinds, kinds


def test_drain_moves_everything_off_a_node_without_failed_requests(cluster):
    c = cluster
    holders = wait_placed(c, "add_sub", 2)
    wait_placed(c, "mlp", 2)
    victim = sorted(holders)[0]
    time.sleep(1.2)  # replicas are moved only once they served the minimum age
    load = start_load(c)
    load.wait_done(300)
    out = ops(c, "drain", victim, "--timeout-secs", "90", timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"node '{victim}' is drained" in out.stdout
    info = c.node_info(victim)
    assert info["placed"] == [], info
    for model in ("add_sub", "mlp"):
        assert victim not in ready_nodes(c, model) and len(ready_nodes(c, model)) == 2, placement(c)[model]
    wait_until(lambda: log_has(c.nodes[victim], "it may be stopped"), 30, "the node to hear it may stop")
    load.wait_done(load.done + 300)
    load.stop()
    print(load.summary())
    load.assert_all_ok()
    status = ops(c, "status", "--json")
    drains = json.loads(status.stdout)["placement"]["drains"]
    assert drains == [{"node": victim, "drained": True}], drains
    bad = ops(c, "drain", "no-such-node")
    assert bad.returncode == 1 and "no connected node is named 'no-such-node'" in bad.stderr, bad.stderr


def sleep_requests(url: str, stop, errors: list) -> None:
    client = grpcclient.InferenceServerClient(url)
    while not stop.is_set():
        ins = [grpcclient.InferInput("X", [1], "FP32"), grpcclient.InferInput("MS", [1], "INT32")]
        ins[0].set_data_from_numpy(np.array([1.5], np.float32))
        ins[1].set_data_from_numpy(np.array([100], np.int32))
        try:
            r = client.infer("sleep_py", ins)
            assert r.as_numpy("Y")[0] == 1.5
        except Exception as e:  # noqa: BLE001 - every failure is asserted on
            errors.append(str(e))
    client.close()


def test_load_scales_a_model_up_to_its_max_and_back_down_to_its_min(cluster):
    import threading

    c = cluster
    wait_placed(c, "sleep_py", 1)
    assert placement(c)["sleep_py"]["wanted"] == 1
    errors: list[str] = []
    stop = threading.Event()
    threads = [threading.Thread(target=sleep_requests, args=(c.router.grpc_url, stop, errors), daemon=True)
               for _ in range(6)]
    for t in threads:
        t.start()
    try:
        # 6 requests in flight, 1 per replica wanted: up to the max of 3 after the 1 s delay.
        wait_until(lambda: len(ready_nodes(c, "sleep_py")) == 3, 90, lambda: f"3 replicas: {placement(c)}")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert not any(t.is_alive() for t in threads), "the load threads did not finish"
    assert not errors, errors[:5]
    # No load: back to the min of 1 after the 3 s delay.
    wait_until(lambda: len(ready_nodes(c, "sleep_py")) == 1 and placement(c)["sleep_py"]["wanted"] == 1, 90,
               lambda: f"back to 1 replica: {placement(c)['sleep_py']}")
    kinds = [(e["kind"], e["model"]) for e in c.view()["placement"]["events"]]
    assert ("scale", "sleep_py") in kinds, kinds
    m = parse_metrics(c.router.metrics())
    assert (metric_sum(m, "mesh_router_placement_events_total", kind="scale") or 0) >= 2


def test_a_node_too_small_never_gets_the_model_and_the_index_says_why(cluster_factory, models_dir, tmp_path):
    repo = copy_models(models_dir / "simple", tmp_path / "repo", ["mlp"])
    (repo / "mlp" / "1" / "padding.bin").write_bytes(b"\0" * (3 << 20))  # about 3 MiB of files
    c = cluster_factory()
    c.start_router([repo], FAST)
    empty_node(c, "small", "--cluster-memory", "1M")
    empty_node(c, "big")
    nodes = wait_placed(c, "mlp", 1)
    assert nodes == {"big"}
    time.sleep(1)
    assert ready_nodes(c, "mlp") == {"big"}, "the small node never gets it"
    row = {r["name"]: r for r in c.router.index()}["mlp"]
    assert row["state"] == "READY", row
    assert "only 1 node can hold it" in row["reason"], row
    out = ops(c, "models")
    assert "1/2" in out.stdout and "only 1 node can hold it" in out.stdout, out.stdout


def test_repository_extension_on_the_router_acts_on_the_cluster(cluster_factory, cluster_repo, models_dir, tmp_path):
    repo = copy_models(cluster_repo, tmp_path / "repo", ["add_sub"])
    broken = repo / "broken_onnx"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    (broken / "1" / "model.onnx").write_bytes(b"not an onnx file")
    gpu = copy_models(models_dir / "simple", repo, ["mlp"], rename={"mlp": "mlp_gpu"}) / "mlp_gpu"
    gpu.joinpath("config.pbtxt").write_text(gpu.joinpath("config.pbtxt").read_text()
                                            + '\ninstance_group [{ kind: KIND_GPU }]\n')
    c = cluster_factory()
    c.start_router([repo], FAST + ["--model-control-mode", "explicit", "--load-model", "add_sub"])
    empty_node(c, "e1")
    empty_node(c, "e2")
    wait_placed(c, "add_sub", 2)
    client = httpclient.InferenceServerClient(c.router.http_url)
    # Unload removes it from every node; a request for it is then unknown.
    client.unload_model("add_sub")
    assert ready_nodes(c, "add_sub") == set()
    for name in ("e1", "e2"):
        assert "add_sub" not in c.node_info(name)["placed"]
    with pytest.raises(InferenceServerException, match="add_sub"):
        check_add_sub(c.router.http_url)
    # Load places it again; the files are already in each node's cache.
    client.load_model("add_sub")
    assert len(ready_nodes(c, "add_sub")) >= 1
    check_add_sub(c.router.http_url)
    wait_until(lambda: any(log_has(c.nodes[n], r"files already in the cache.*model=add_sub") for n in ("e1", "e2")),
               30, "a node to load add_sub from its cache")
    # A load with a config override places that config.
    cfg = client.get_model_config("add_sub")
    cfg["max_batch_size"] = 4
    client.load_model("add_sub", config=json.dumps(cfg))
    wait_until(lambda: client.get_model_config("add_sub")["max_batch_size"] == 4, 30, "the override to serve")
    # An override the nodes cannot load fails the load, and the versions already serving stay.
    cfg["max_batch_size"] = 0
    with pytest.raises(InferenceServerException, match="dims"):
        client.load_model("add_sub", config=json.dumps(cfg))
    check_add_sub(c.router.http_url)
    # A node that joins later gets what serves, not the override that failed.
    empty_node(c, "e3")
    out = ops(c, "scale", "add_sub", "--min", "3", "--max", "3")
    assert out.returncode == 0, out.stderr
    wait_until(lambda: len(ready_nodes(c, "add_sub")) == 3, 30, lambda: f"add_sub on 3 nodes: {placement(c)}")
    assert client.get_model_config("add_sub")["max_batch_size"] == 4
    # A model no node can load fails with every node's reason in the answer and the index.
    with pytest.raises(InferenceServerException, match="broken_onnx"):
        client.load_model("broken_onnx")
    row = {r["name"]: r for r in client.get_model_repository_index()}["broken_onnx"]
    assert row["state"] != "READY" and ("e1" in row["reason"] or "e2" in row["reason"]), row
    # A KIND_GPU model is never placed on CPU-only nodes, and says so.
    with pytest.raises(InferenceServerException, match="GPU"):
        client.load_model("mlp_gpu")
    # Unknown models, and scaling them, are clear errors.
    with pytest.raises(InferenceServerException, match="no such model directory"):
        client.load_model("nope")
    out = ops(c, "scale", "add_sub", "--min", "1", "--max", "1")
    assert out.returncode == 0 and "between 1 and 1" in out.stdout, out.stdout + out.stderr
    wait_until(lambda: len(ready_nodes(c, "add_sub")) == 1, 30, "add_sub scaled to 1")
    bad = ops(c, "scale", "add_sub", "--min", "3", "--max", "2")
    assert bad.returncode == 1 and "min" in bad.stderr, bad.stderr
    gone = ops(c, "scale", "nope", "--min", "1")
    assert gone.returncode == 1 and "nope" in gone.stderr, gone.stderr
    client.close()


def test_mesh_ops_names_an_unreachable_router(cluster_bins):
    out = subprocess.run([str(cluster_bins["ops"]), "models", "--router", "http://127.0.0.1:1", "--timeout-secs", "2"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert "cannot reach the router at http://127.0.0.1:1" in out.stderr, out.stderr


def test_poll_mode_places_new_models_ships_changed_ones_and_unloads_removed_ones(cluster_factory, cluster_repo,
                                                                                  tmp_path):
    repo = copy_models(cluster_repo, tmp_path / "repo", ["add_sub"])
    c = cluster_factory()
    c.start_router([repo], FAST + ["--model-control-mode", "poll", "--repository-poll-secs", "1"])
    empty_node(c, "p1")
    empty_node(c, "p2")
    wait_placed(c, "add_sub", 2)
    copy_models(cluster_repo, repo, ["mlp"])
    wait_placed(c, "mlp", 2, timeout=30)
    # A changed config is shipped again to the nodes that hold the model.
    cfg = repo / "add_sub" / "config.pbtxt"
    cfg.write_text(re.sub(r"max_batch_size:\s*\d+", "max_batch_size: 4", cfg.read_text()))
    client = httpclient.InferenceServerClient(c.router.http_url)
    wait_until(lambda: client.get_model_config("add_sub")["max_batch_size"] == 4, 30, "the changed config to serve")
    check_add_sub(c.router.http_url)
    # A removed model is unloaded everywhere.
    shutil.rmtree(repo / "mlp")
    wait_until(lambda: "mlp" not in placement(c) and all("mlp" not in c.node_info(n)["placed"] for n in ("p1", "p2")),
               30, lambda: f"mlp unloaded everywhere: {c.view()['nodes']}")
    client.close()


def test_file_overrides_through_the_router_are_shipped_and_placed(cluster_factory, cluster_repo, tmp_path):
    c = cluster_factory()
    c.start_router([copy_models(cluster_repo, tmp_path / "repo", ["add_sub"])],
                   FAST + ["--model-control-mode", "explicit"])
    empty_node(c, "f1")
    client = httpclient.InferenceServerClient(c.router.http_url)
    onnx = (cluster_repo / "add_sub" / "1" / "model.onnx").read_bytes()
    config = json.dumps({"name": "add_sub_files", "platform": "onnxruntime_onnx", "max_batch_size": 8})
    client.load_model("add_sub_files", config=config, files={"file:1/model.onnx": onnx})
    assert ready_nodes(c, "add_sub_files") == {"f1"}
    a, b = add_sub_inputs(3)
    ins = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    r = client.infer("add_sub_files", ins)
    assert np.array_equal(r.as_numpy("OUTPUT1"), a - b)
    with pytest.raises(InferenceServerException, match="config"):
        client.load_model("add_sub_files", files={"file:1/model.onnx": onnx})
    client.unload_model("add_sub_files")
    assert "add_sub_files" not in c.node_info("f1")["placed"]
    with pytest.raises(InferenceServerException, match="not loaded"):
        client.unload_model("add_sub")
    client.close()


# The restarted router's --placement-grace-ms: every node must rejoin and report within it, however
# loaded the machine (the default, 3 s, is for a real restart).
RESTART_GRACE_MS = 20_000


def settled(c, nodes) -> bool:
    """Placement at rest: every replica ready, each model at its wanted count, and the replicas per node
    differing by at most one, so the placer starts no move (it moves while they differ by more)."""
    models = placement(c)
    per_node = dict.fromkeys(nodes, 0)
    for m in models.values():
        if len(m["replicas"]) != m["wanted"] or any(r["state"] != "ready" for r in m["replicas"]):
            return False
        for r in m["replicas"]:
            per_node[r["node"]] = per_node.get(r["node"], 0) + 1
    return max(per_node.values()) - min(per_node.values()) <= 1


def test_a_restarted_router_adopts_what_the_nodes_serve_instead_of_placing_again(cluster_factory, cluster_repo):
    from cluster_util import free_udp_port

    c = cluster_factory()
    c.start_router([cluster_repo], FAST, cluster_port=free_udp_port())
    for name in ("r1", "r2", "r3"):
        empty_node(c, name)
    for m, n in (("add_sub", 2), ("mlp", 2), ("sleep_py", 1)):
        wait_placed(c, m, n)
    # A node that joined after the first placement gets replicas moved to it: wait until that is over.
    wait_until(lambda: settled(c, c.nodes), 60, lambda: f"placement to settle: {placement(c)}")
    before = {m: ready_nodes(c, m) for m in ("add_sub", "mlp", "sleep_py")}
    assert [len(before[m]) for m in ("add_sub", "mlp", "sleep_py")] == [2, 2, 1], before
    placed_lines = {n: c.nodes[n].log_path.read_text(errors="replace").count("the router places a model here")
                    for n in c.nodes}
    c.router.stop(grace=5)
    c.router.args += ["--placement-grace-ms", str(RESTART_GRACE_MS)]
    c.router.start([], timeout=60)
    grace_over = time.monotonic() + RESTART_GRACE_MS / 1000  # the router's grace began before this
    for name in c.nodes:
        wait_until(lambda: c.state(name) == "up", 60, f"{name} to rejoin")
    after = {m: wait_placed(c, m, n) for m, n in (("add_sub", 2), ("mlp", 2), ("sleep_py", 1))}
    assert after == before, "the same replicas, adopted"
    assert time.monotonic() < grace_over, "the nodes were adopted only after the grace ran out (raise RESTART_GRACE_MS)"
    # Past the grace the placer acts: it must find nothing to place (a few seconds of its ticks).
    time.sleep(grace_over + 5 - time.monotonic())
    again = {n: c.nodes[n].log_path.read_text(errors="replace").count("the router places a model here")
             for n in c.nodes}
    assert again == placed_lines, "nothing was placed again"
    events = c.view()["placement"]["events"]
    assert not [e for e in events if e["kind"] in ("place", "move")], events
    assert {m: ready_nodes(c, m) for m in before} == before
    check_add_sub(c.router.http_url)


def test_a_nodes_own_models_are_routed_but_never_moved_or_placed_over(cluster_factory, cluster_repo, models_dir,
                                                                      tmp_path):
    own = copy_models(models_dir / "simple", tmp_path / "own", ["mlp"])
    c = cluster_factory()
    c.start_router([cluster_repo], FAST + ["--model-control-mode", "explicit", "--load-model", "mlp"])
    c.start_node("own", [own], ["--cluster-cache", str(tmp_path / "own-cache")], wait_models=["mlp"])
    empty_node(c, "e1")
    empty_node(c, "e2")
    # The router's mlp goes to the two empty nodes, never over the node's own mlp.
    assert wait_placed(c, "mlp", 2) == {"e1", "e2"}
    time.sleep(1)
    assert c.node_info("own")["placed"] == [] and c.node_info("own")["models"] == ["mlp:1"]
    # Unloading the router's mlp leaves the node's own one serving, and routed to.
    httpclient.InferenceServerClient(c.router.http_url).unload_model("mlp")
    assert c.node_info("own")["models"] == ["mlp:1"]
    rows = {r["name"]: r for r in c.router.index()}
    assert rows["mlp"]["state"] == "READY" and rows["mlp"]["nodes"] == ["own"], rows["mlp"]
