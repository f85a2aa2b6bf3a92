"""A cluster of one mesh-router and three mesh-nodes (mutual TLS with certificates from
`mesh-ops certs`), driven through the router with the real tritonclient over HTTP and gRPC: health
and metadata, every data type, decoupled streaming and cancellation, statistics summed over the
nodes, the repository index with the nodes of each model, `mesh-ops status`, and the router's
metrics. The cluster is shared by the module; no test here breaks it."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cluster_util import add_sub_inputs, copy_models, shm_bytes, wait_until
from mesh_util import HOST, free_ports, http_request, metric, metric_sum, parse_metrics
from test_decoupled import Stream
from test_dtypes import DTYPES, JSON_DTYPES, assert_same, model as identity, sample

pytestmark = [pytest.mark.server, pytest.mark.cluster]

PY_MODELS = Path(__file__).parent / "python_models"
PY_ARGS = ["--backend-config", f"python,interpreter={sys.executable}",
           "--backend-config", "python,execute-timeout-seconds=30"]
NODES = ["n1", "n2", "n3"]


def test_router_metrics_grow_no_series_for_unknown_model_names(cluster, http):
    """Requests for names the cluster does not serve are answered 'not found' and leave no series
    behind: otherwise any client could grow the router's memory and /metrics without bound."""
    names = [f"made_up_{i}_{os.getpid()}" for i in range(20)]
    for name in names:
        ins, _, _ = add_sub_request(httpclient, 0)
        with pytest.raises(InferenceServerException, match="not found"):
            http.infer(name, ins)
    text = cluster.router.metrics()
    assert not [n for n in names if n in text], [l for l in text.splitlines() if "made_up_" in l][:5]
    # A known model's failures still count.
    fail0 = metric_sum(parse_metrics(text), "nv_inference_request_failure", model="add_sub") or 0
    bad = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException):
        http.infer("add_sub", [bad])
    after = parse_metrics(cluster.router.metrics())
    assert (metric_sum(after, "nv_inference_request_failure", model="add_sub") or 0) == fail0 + 1


@pytest.fixture(scope="module")
def cluster(module_cluster_factory, models_dir, tmp_path_factory):
    """n1: dtypes, add_sub, mlp, repeat_py, ticker_py; n2: dtypes, add_sub, repeat_py, ticker_py;
    n3: dtypes, add_sub."""
    tmp = tmp_path_factory.mktemp("cluster")
    base = copy_models(models_dir / "simple", tmp / "base", ["add_sub"])
    only_n1 = copy_models(models_dir / "simple", tmp / "only_n1", ["mlp"])
    py = copy_models(PY_MODELS, tmp / "py", ["repeat_py", "ticker_py"])
    c = module_cluster_factory("cl-main")
    c.start_router()
    c.start_node("n1", [models_dir / "dtypes", base, only_n1, py], PY_ARGS)
    c.start_node("n2", [models_dir / "dtypes", base, py], PY_ARGS)
    c.start_node("n3", [models_dir / "dtypes", base])
    return c


@pytest.fixture(scope="module")
def router(cluster):
    return cluster.router


@pytest.fixture
def http(router):
    c = httpclient.InferenceServerClient(router.http_url, network_timeout=60)
    yield c
    c.close()


@pytest.fixture
def grpc(router):
    c = grpcclient.InferenceServerClient(router.grpc_url)
    yield c
    c.close()


def add_sub_request(mod, i):
    a, b = add_sub_inputs(i)
    ins = [mod.InferInput("INPUT0", [1, 16], "FP32"), mod.InferInput("INPUT1", [1, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    return ins, a, b


def node_stats(node, model="add_sub"):
    c = httpclient.InferenceServerClient(node.http_url)
    try:
        return c.get_inference_statistics(model)["model_stats"]
    finally:
        c.close()


# --------------------------------------------------------------------------
# health, metadata, config
# --------------------------------------------------------------------------

def test_server_is_live_ready_and_describes_itself(http, grpc):
    assert http.is_server_live() and http.is_server_ready()
    assert grpc.is_server_live() and grpc.is_server_ready()
    md = http.get_server_metadata()
    assert md["version"] and {"binary_tensor_data", "statistics", "model_configuration"} <= set(md["extensions"])
    gmd = grpc.get_server_metadata(as_json=True)
    assert gmd["version"] == md["version"] and set(gmd["extensions"]) == set(md["extensions"])


@pytest.mark.parametrize("model", ["add_sub", "mlp", "identity_bytes"])
def test_model_metadata_and_config_are_the_nodes(cluster, http, grpc, model):
    """The router answers a model's metadata and config as a node serving it does."""
    node = cluster.nodes["n1"]
    assert http.get_model_metadata(model) == node.get_json(f"/v2/models/{model}")
    assert http.get_model_config(model) == node.get_json(f"/v2/models/{model}/config")
    g = grpc.get_model_metadata(model, as_json=True)
    assert g["name"] == model and [i["name"] for i in g["inputs"]] == \
        [i["name"] for i in node.get_json(f"/v2/models/{model}")["inputs"]]
    assert grpc.get_model_config(model, as_json=True)["config"]["name"] == model
    assert http.is_model_ready(model) and grpc.is_model_ready(model)
    assert http.is_model_ready(model, "1") and not http.is_model_ready(model, "9")


def test_an_unknown_model_is_not_ready_and_not_found(cluster, http, grpc):
    assert not http.is_model_ready("no_such_model") and not grpc.is_model_ready("no_such_model")
    with pytest.raises(InferenceServerException) as e:
        http.get_model_metadata("no_such_model")
    node = cluster.nodes["n1"].get("/v2/models/no_such_model")
    assert e.value.status() == str(node.status) and node.status in (400, 404), (e.value, node)
    assert "no_such_model" in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        grpc.get_model_metadata("no_such_model")
    assert e.value.status() == "StatusCode.NOT_FOUND", e.value
    ins, _, _ = add_sub_request(httpclient, 0)
    with pytest.raises(InferenceServerException) as e:
        http.infer("no_such_model", ins)
    assert "no_such_model" in str(e.value)


# --------------------------------------------------------------------------
# every data type, over HTTP binary and JSON and over gRPC
# --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_http_binary(http, dtype):
    x = sample(dtype)
    inp = httpclient.InferInput("INPUT0", list(x.shape), dtype)
    inp.set_data_from_numpy(x, binary_data=True)
    res = http.infer(identity(dtype), [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)])
    out = res.get_output("OUTPUT0")
    assert out["datatype"] == dtype and out["shape"] == [2, 3] and "binary_data_size" in out["parameters"]
    assert_same(res.as_numpy("OUTPUT0"), x, dtype)


@pytest.mark.parametrize("dtype", JSON_DTYPES)
def test_roundtrip_http_json(http, dtype):
    x = sample(dtype, json_safe=True)
    inp = httpclient.InferInput("INPUT0", list(x.shape), dtype)
    inp.set_data_from_numpy(x, binary_data=False)
    res = http.infer(identity(dtype), [inp], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    out = res.get_output("OUTPUT0")
    assert "data" in out and out["datatype"] == dtype
    assert_same(res.as_numpy("OUTPUT0"), x, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_roundtrip_grpc(grpc, dtype):
    x = sample(dtype)
    inp = grpcclient.InferInput("INPUT0", list(x.shape), dtype)
    inp.set_data_from_numpy(x)
    res = grpc.infer(identity(dtype), [inp])
    out = res.get_output("OUTPUT0")
    assert out.datatype == dtype and list(out.shape) == [2, 3]
    assert_same(res.as_numpy("OUTPUT0"), x, dtype)


# --------------------------------------------------------------------------
# decoupled streaming through the router
# --------------------------------------------------------------------------

def test_a_decoupled_model_streams_every_answer_then_the_final_flag(router):
    s = Stream(router.grpc_url)
    try:
        for k, mode in enumerate(["inline", "thread"] * 3):
            s.send([5 + k, 6, 7 + k], request_id=f"r{k}", mode=mode)
            outputs, errors = s.until_final()
            assert errors == []
            assert outputs == [(5 + k, 0, f"r{k}"), (6, 1, f"r{k}"), (7 + k, 2, f"r{k}")]
        s.send([], request_id="none")
        assert s.until_final() == ([], []), "zero answers is only the final flag"
        s.send([10, 11, 12], request_id="e", error_at=1)
        outputs, errors = s.until_final()
        assert [o[:2] for o in outputs] == [(10, 0), (12, 2)]
        assert len(errors) == 1 and "no answer for element 1" in errors[0]
    finally:
        s.close()


def test_cancelling_the_stream_reaches_is_cancelled_on_the_node(router, tmp_path):
    marker = tmp_path / "cancelled.txt"
    s = Stream(router.grpc_url)
    t = grpcclient.InferInput("PERIOD_MS", [1], "INT32")
    t.set_data_from_numpy(np.array([5], np.int32))
    s.client.async_stream_infer("ticker_py", [t], parameters={"marker": str(marker)})
    ticks = []
    for _ in range(3):
        result, error = s.next()
        assert error is None, error
        ticks.append(int(result.as_numpy("TICK")[0]))
    assert ticks == [0, 1, 2]
    s.close(cancel=True)
    wait_until(marker.exists, 30, "the node's model to notice the cancellation")
    text = marker.read_text()
    assert text.startswith("cancelled=True"), text
    assert int(text.split("ticks=")[1]) < 3000, "the model stopped early, not at its bound"
    again = Stream(router.grpc_url)
    try:
        again.send([8], request_id="next")
        assert again.until_final() == ([(8, 0, "next")], [])
    finally:
        again.close()


def test_a_decoupled_model_over_unary_paths_is_refused_clearly(http):
    t = httpclient.InferInput("IN", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException) as e:
        http.infer("repeat_py", [t])
    assert "decoupled" in str(e.value)


# --------------------------------------------------------------------------
# statistics, repository index, cluster view, mesh-ops status, metrics
# --------------------------------------------------------------------------

def counts(stats):
    s = stats[0]
    return int(s["inference_count"]), int(s["execution_count"]), int(s["inference_stats"]["success"]["count"])


def test_statistics_are_summed_over_the_nodes(cluster, http, grpc):
    n = 60
    before_router = counts(http.get_inference_statistics("add_sub")["model_stats"])
    before_nodes = {name: counts(node_stats(cluster.nodes[name])) for name in NODES}
    for i in range(n):
        mod, client = (httpclient, http) if i % 2 else (grpcclient, grpc)
        ins, a, b = add_sub_request(mod, i)
        np.testing.assert_array_equal(client.infer("add_sub", ins).as_numpy("OUTPUT0"), a + b)
    after_router = http.get_inference_statistics("add_sub")["model_stats"]
    assert len(after_router) == 1 and after_router[0]["name"] == "add_sub" and after_router[0]["version"] == "1"
    after_router = counts(after_router)
    after_nodes = {name: counts(node_stats(cluster.nodes[name])) for name in NODES}
    per_node = {k: after_nodes[k][0] - before_nodes[k][0] for k in NODES}
    print(f"requests per node: {per_node}")
    assert sum(per_node.values()) == n, per_node
    assert sum(1 for v in per_node.values() if v > 0) >= 2, f"the router spread nothing: {per_node}"
    assert [after_router[i] - before_router[i] for i in range(3)] == [n, n, n]
    assert list(after_router) == [sum(after_nodes[k][i] for k in NODES) for i in range(3)], \
        "the router's numbers are the sum of the nodes' own"
    g = grpc.get_inference_statistics("add_sub", as_json=True)["model_stats"][0]
    assert int(g["inference_count"]) == after_router[0]


def test_statistics_of_every_model_and_of_an_unknown_one(http):
    every = http.get_inference_statistics()["model_stats"]
    keys = [(m["name"], m["version"]) for m in every]
    assert len(keys) == len(set(keys)), "one row per model version, merged over the nodes"
    assert {"add_sub", "mlp", "repeat_py", "identity_fp32"} <= {k[0] for k in keys}
    row = next(m for m in every if m["name"] == "add_sub")
    assert row["inference_count"] == http.get_inference_statistics("add_sub")["model_stats"][0]["inference_count"]
    with pytest.raises(InferenceServerException):
        http.get_inference_statistics("no_such_model")


def test_repository_index_names_the_nodes_of_each_model(router, http, grpc):
    rows = {(r["name"], r["version"]): r for r in router.index()}
    assert rows[("add_sub", "1")]["state"] == "READY"
    assert sorted(rows[("add_sub", "1")]["nodes"]) == NODES
    assert rows[("mlp", "1")]["nodes"] == ["n1"]
    assert sorted(rows[("repeat_py", "1")]["nodes"]) == ["n1", "n2"]
    assert sorted(rows[("identity_bf16", "1")]["nodes"]) == NODES
    via_client = {r["name"]: r for r in http.get_model_repository_index()}
    assert sorted(via_client["ticker_py"]["nodes"]) == ["n1", "n2"]
    g = {m["name"]: m for m in grpc.get_model_repository_index(as_json=True)["models"]}
    assert g["add_sub"]["state"] == "READY" and set(g) >= {"mlp", "ticker_py", "identity_int8"}


def test_cluster_view_describes_router_nodes_and_models(cluster):
    view = cluster.view()
    r = view["router"]
    assert r["id"] and r["version"] and r["uptime_s"] > 0
    nodes = {n["name"]: n for n in view["nodes"]}
    assert sorted(nodes) == NODES
    for name, n in nodes.items():
        assert n["state"] == "up", f"{name}: state {n['state']!r} (the API's states are up|draining|silent|lost)"
        assert re.fullmatch(r"[0-9a-f]{16}", n["incarnation"]), n["incarnation"]
        assert n["address"].startswith("127.0.0.1:"), n["address"]
        assert "cpu" in n["devices"]
        assert n["models_ready"] == len(n["models"]) and n["inflight"] == 0
        assert n["last_report_ms"] is not None and 0 <= n["last_report_ms"] < 5000, "reports every 250 ms"
    assert "add_sub:1" in nodes["n3"]["models"] and "mlp:1" not in nodes["n3"]["models"]
    assert {"mlp:1", "ticker_py:1", "identity_fp16:1"} <= set(nodes["n1"]["models"])
    models = {(m["name"], m["version"]): m for m in view["models"]}
    assert models[("mlp", "1")] == {"name": "mlp", "version": "1", "state": "READY", "nodes": ["n1"], "reason": ""}
    assert len({n["incarnation"] for n in nodes.values()}) == 3


def ops(cluster, *args):
    return subprocess.run([str(cluster.bins["ops"]), *args], capture_output=True, text=True, timeout=30)


def table(text, title):
    """Rows (lists of cells split on 2+ spaces) of the table under `title`."""
    lines = text.split(f"\n{title}\n", 1)[1].split("\n\n", 1)[0].strip().splitlines()
    split = lambda line: re.split(r"\s{2,}", line.strip())
    header = split(lines[0])
    return [dict(zip(header, split(line))) for line in lines[1:]]


def test_mesh_ops_status_shows_the_nodes_and_models(cluster):
    res = ops(cluster, "status", "--router", f"http://{cluster.router.http_url}")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert re.search(r"3 nodes \(3 up\)", out), out.splitlines()[0]
    nodes = {r["NAME"]: r for r in table(out, "NODES")}
    assert sorted(nodes) == NODES, out
    assert all(r["STATE"].lower() == "up" for r in nodes.values()), out
    assert nodes["n3"]["DEVICES"] == "cpu"
    models = {(r["NAME"], r["VERSION"]): r for r in table(out, "MODELS")}
    assert models[("add_sub", "1")]["NODES"] == "n1, n2, n3" and models[("add_sub", "1")]["STATE"] == "READY"
    assert models[("mlp", "1")]["NODES"] == "n1"
    assert models[("repeat_py", "1")]["NODES"] == "n1, n2"
    bare = ops(cluster, "status", "--router", cluster.router.http_url)
    assert bare.returncode == 0 and "NODES" in bare.stdout, "HOST:PORT without http:// works too"


def test_mesh_ops_status_json_is_the_cluster_view(cluster):
    res = ops(cluster, "status", "--router", f"http://{cluster.router.http_url}", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    view = cluster.view()
    assert data["router"]["id"] == view["router"]["id"]
    stable = lambda v: sorted((n["name"], n["incarnation"], n["state"], tuple(n["models"])) for n in v["nodes"])
    assert stable(data) == stable(view)
    assert data["models"] == view["models"]


def test_mesh_ops_status_says_when_the_router_is_unreachable(cluster):
    (port,) = free_ports(1)
    res = ops(cluster, "status", "--router", f"http://{HOST}:{port}", "--timeout-secs", "2")
    assert res.returncode != 0
    assert "cannot reach the router" in res.stderr + res.stdout


def test_router_metrics_count_requests_nodes_and_links(cluster, http):
    before = parse_metrics(cluster.router.metrics())
    ok0 = metric_sum(before, "nv_inference_request_success", model="add_sub", version="1") or 0
    fail0 = metric_sum(before, "nv_inference_request_failure", model="add_sub") or 0
    sent0 = metric_sum(before, "mesh_router_requests_total") or 0
    n = 12
    for i in range(n):
        ins, a, b = add_sub_request(httpclient, i)
        np.testing.assert_array_equal(http.infer("add_sub", ins).as_numpy("OUTPUT1"), a - b)
    bad = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
    with pytest.raises(InferenceServerException):
        http.infer("add_sub", [bad])

    def settled():  # the node-state and link gauges are sampled once a second
        s = parse_metrics(cluster.router.metrics())
        up = metric_sum(s, "mesh_router_nodes", state="up")
        rtts = {lab["node"] for lab, _ in metric(s, "mesh_router_link_rtt_us")}
        return s if up == 3 and rtts == set(NODES) else None

    try:
        after = wait_until(settled, 30, "mesh_router_nodes{state=up} == 3 and a link RTT per node")
    except AssertionError:
        s = parse_metrics(cluster.router.metrics())
        pytest.fail(f"mesh_router_nodes: {metric(s, 'mesh_router_nodes')}, "
                    f"link rtt: {metric(s, 'mesh_router_link_rtt_us')}")
    assert metric_sum(after, "nv_inference_request_success", model="add_sub", version="1") - ok0 == n
    assert metric_sum(after, "nv_inference_request_failure", model="add_sub") - fail0 == 1
    assert metric_sum(after, "nv_inference_count", model="add_sub", version="1") >= n
    assert metric_sum(after, "nv_inference_request_duration_us", model="add_sub", version="1") > 0
    per_node = {lab["node"] for lab, v in metric(after, "mesh_router_requests_total") if v > 0}
    assert per_node <= set(NODES) and len(per_node) >= 2
    assert metric_sum(after, "mesh_router_requests_total") - sent0 >= n + 1
    assert metric_sum(after, "mesh_router_nodes", state="lost") == 0
    assert all(v >= 0 for _, v in metric(after, "mesh_router_inflight"))
    # Every family has its help text, as the node's do (tests/test_metrics.py).
    lines = cluster.router.metrics().splitlines()
    helped = {line.split()[2] for line in lines if line.startswith("# HELP ")}
    assert [line.split()[2] for line in lines if line.startswith("# TYPE ") and line.split()[2] not in helped] == []


# --------------------------------------------------------------------------
# the link's shared memory (router and nodes on one host)
# --------------------------------------------------------------------------

def identity_request(n: int):
    x = np.arange(n, dtype=np.float32).reshape(1, n)
    inp = grpcclient.InferInput("INPUT0", [1, n], "FP32")
    inp.set_data_from_numpy(x)
    return inp, x


def test_large_tensors_go_through_shared_memory_both_ways_and_small_ones_do_not(cluster, grpc):
    """Every process here runs on this host, so each link found the other end's arena: a 1 MiB
    request is written into the node's arena and its answer into the router's; a 64-byte one
    travels over QUIC."""
    procs = [cluster.router, *cluster.nodes.values()]
    before = [shm_bytes(p) for p in procs]
    inp, x = identity_request(1 << 18)
    for _ in range(3):
        np.testing.assert_array_equal(grpc.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), x)
    mid = [shm_bytes(p) for p in procs]
    router_sent, router_received = (mid[0][i] - before[0][i] for i in (0, 1))
    nodes_sent = sum(m[0] - b[0] for m, b in zip(mid[1:], before[1:]))
    nodes_received = sum(m[1] - b[1] for m, b in zip(mid[1:], before[1:]))
    assert router_sent >= 3 * x.nbytes and nodes_received == router_sent, (before, mid)
    assert nodes_sent >= 3 * x.nbytes and router_received == nodes_sent, (before, mid)
    inp, x = identity_request(16)
    np.testing.assert_array_equal(grpc.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), x)
    assert [shm_bytes(p) for p in procs] == mid


def test_without_shared_memory_large_tensors_travel_over_quic(cluster_factory, models_dir):
    """`--cluster-shared-memory false` on the node: it offers no arena and opens none, so the same
    1 MiB request and answer cross the link as QUIC packets, and arrive whole."""
    c = cluster_factory()
    c.start_router()
    node = c.start_node("n1", [models_dir / "dtypes"], ["--cluster-shared-memory", "false"])
    client = grpcclient.InferenceServerClient(c.router.grpc_url)
    try:
        inp, x = identity_request(1 << 18)
        np.testing.assert_array_equal(client.infer("identity_fp32", [inp]).as_numpy("OUTPUT0"), x)
    finally:
        client.close()
    assert shm_bytes(c.router) == (0, 0) and shm_bytes(node) == (0, 0)


def test_model_control_through_the_router_needs_explicit_mode(cluster):
    """A router in the default control mode (none) refuses load/unload as tritonserver does, 503
    with its message (tests/test_access.py: no code runs; test_cluster_placement.py: explicit mode)."""
    for path in ("/v2/repository/models/add_sub/load", "/v2/repository/models/add_sub/unload"):
        r = http_request(cluster.router.http_port, "POST", path, body=b"")
        assert r.status == 503, (path, r.status)
        assert b"explicit model load / unload is not allowed" in r.body, r.body
