"""OpenTelemetry traces across a cluster (issue 58, part 2): mesh-router's spans (InferRequest > route >
attempt, a router ensemble's span, retries) and the trace context it carries over the cluster link, so
that one client request is one trace across the router and its nodes, a BLS call that leaves a node
through the router included. Real processes, all exporting to one tests/otlp_collector.py."""
import json
import secrets
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from cluster_util import GATED_SLEEP, copy_models, wait_until
from mesh_util import free_ports
from otlp_collector import Collector

pytestmark = [pytest.mark.server, pytest.mark.cluster]

PY_MODELS = Path(__file__).parent / "python_models"
PY_ARGS = ["--backend-config", f"python,interpreter={sys.executable}",
           "--backend-config", "python,execute-timeout-seconds=30"]
ROUTER_NAME = "rtr-trace"
NODE_A_SERVICE = "node-A"  # node B keeps Triton's default service.name
DEFAULT_NODE_SERVICE = "triton-inference-server"
ROUTER_SERVICE = "mesh-router"
SERVER, INTERNAL, CLIENT = 2, 1, 3
# The frontend's stamps on the router's InferRequest, as on a node's (where the core's
# INFER_RESPONSE_COMPLETE falls between them; the router has no core, so it may leave that one out).
ROOT_EVENTS = {"http": ["HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"],
               "grpc": ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"]}

# bls_call (node A): OUTPUT0, OUTPUT1 = add_sub(INPUT0, INPUT1), one BLS call carrying the request's trace;
# only node B serves add_sub, so the call leaves A through the router.
BLS_CALL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            inputs = [pb_utils.get_input_tensor_by_name(r, n) for n in ("INPUT0", "INPUT1")]
            answer = pb_utils.InferenceRequest(model_name="add_sub", requested_output_names=["OUTPUT0", "OUTPUT1"],
                                               inputs=inputs, trace=r.trace()).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out.append(pb_utils.InferenceResponse(answer.output_tensors()))
        return out
'''
BLS_CONFIG = ('name: "bls_call"\nbackend: "python"\nmax_batch_size: 8\n'
              'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
              ' { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
              'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },'
              ' { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n')
# chain (the router's repository): add_sub_x on node A, then add_sub on node B.
CHAIN = '''name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "TWICE_A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "TWICE_B" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "add_sub_x" model_version: -1 input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
    output_map { key: "OUTPUT0" value: "S" } output_map { key: "OUTPUT1" value: "D" } },
  { model_name: "add_sub" model_version: -1 input_map { key: "INPUT0" value: "S" } input_map { key: "INPUT1" value: "D" }
    output_map { key: "OUTPUT0" value: "TWICE_A" } output_map { key: "OUTPUT1" value: "TWICE_B" } } ] }
'''


def trace_args(port, rate=1, service=None):
    """Triton's OpenTelemetry flags, exporting to the collector on `port` every 200 ms."""
    flags = ["mode=opentelemetry", "level=TIMESTAMPS", f"rate={rate}", f"opentelemetry,url=localhost:{port}/v1/traces",
             "opentelemetry,bsp_schedule_delay=200"]
    if service:
        flags.append(f"opentelemetry,resource=service.name={service}")
    return [a for f in flags for a in ("--trace-config", f)]


def new_parent():
    """A client's W3C traceparent of a fresh trace: (header, trace id, span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def start_collector(tmp_path):
    """The fixture collector, writing each OTLP request it receives as a line at once."""
    port = free_ports(1)[0]
    return Collector(port, tmp_path / "collected_traces.json", send_batch_size=1, timeout=0.2).start()


def collected(collector):
    """Every span the collector wrote, each with `service` (its resource's service.name) and `scope`."""
    out = []
    for line in collector.path.read_text().split("\n")[:-1]:  # not a line still being written
        if not line.strip():
            continue
        for rs in json.loads(line)["resourceSpans"]:
            resource = {a["key"]: a["value"].get("stringValue") for a in rs["resource"].get("attributes", [])}
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    out.append(dict(s, service=resource.get("service.name"), scope=ss["scope"].get("name")))
    return out


def wait_trace(collector, trace_id, count, timeout=30.0, settle=1.0):
    """The spans of `trace_id` once there are `count` (then `settle` s more for any stray one)."""
    wait_until(lambda: len([s for s in collected(collector) if s["traceId"] == trace_id]) >= count, timeout,
               lambda: f"{count} spans of trace {trace_id}; have "
                       f"{[(s['service'], s['name']) for s in collected(collector) if s['traceId'] == trace_id]}")
    time.sleep(settle)
    return [s for s in collected(collector) if s["traceId"] == trace_id]


def attrs(span):
    """A span's attributes as plain values (integers are strings in the Collector's JSON)."""
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}


class Tree:
    """One trace's spans by id, with lookups of a span's children."""

    def __init__(self, spans):
        self.spans = spans
        self.by_id = {s["spanId"]: s for s in spans}
        assert len(self.by_id) == len(spans), "span ids are unique"

    def children(self, parent, name=None):
        return [s for s in self.spans if s["parentSpanId"] == parent["spanId"] and name in (None, s["name"])]

    def child(self, parent, name):
        found = self.children(parent, name)
        assert len(found) == 1, (f"{parent['service']}:{parent['name']} has {len(found)} children named {name}: "
                                 f"{[(s['service'], s['name']) for s in self.children(parent)]}")
        return found[0]


def check_router_hop(tree, parent, model, node, node_service, attempts=1):
    """Under `parent`: the router's `route` of `model` and its `attempt`(s), the last one's child the
    node's InferRequest > `model` > compute. Returns the node's InferRequest."""
    route = tree.child(parent, "route")
    assert (route["kind"], route["service"], route["scope"]) == (INTERNAL, ROUTER_SERVICE, "mesh-router"), route
    a = attrs(route)
    assert (a["triton.model_name"], a["mesh.model_version"], a["mesh.attempts"], a["mesh.outcome"], a["mesh.router"]) \
        == (model, "1", str(attempts), "ok", ROUTER_NAME), a
    tries = sorted(tree.children(route, "attempt"), key=lambda s: int(attrs(s)["mesh.attempt"]))
    assert [attrs(t)["mesh.attempt"] for t in tries] == [str(k) for k in range(1, attempts + 1)], tries
    assert {s["name"] for s in tree.children(route)} == {"attempt"}, "no wait for a replica that was up"
    last = tries[-1]
    assert (last["kind"], last["service"]) == (CLIENT, ROUTER_SERVICE), last
    a = attrs(last)
    assert (a["mesh.node"], a["mesh.outcome"]) == (node, "ok") and a["mesh.pick"], a
    root = tree.child(last, "InferRequest")
    span = tree.child(root, model)
    compute = tree.child(span, "compute")
    for s in (root, span, compute):
        assert (s["service"], s["scope"], s["kind"]) == (node_service, "triton-server", SERVER), s
    assert attrs(span)["triton.model_name"] == model
    return root


def check_router_root(root, parent_span, frontend=None):
    assert (root["name"], root["kind"], root["service"], root["scope"]) == \
        ("InferRequest", SERVER, ROUTER_SERVICE, "mesh-router"), root
    assert root["parentSpanId"] == parent_span, root
    if frontend:
        events = [e["name"] for e in root.get("events", [])]
        assert [e for e in events if e != "INFER_RESPONSE_COMPLETE"] == ROOT_EVENTS[frontend], events
        times = [int(e["timeUnixNano"]) for e in root["events"]]
        assert times == sorted(times) and int(root["startTimeUnixNano"]) <= times[0], root


def add_sub_inputs(mod, names=("INPUT0", "INPUT1")):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 0.5, np.float32)
    ins = [mod.InferInput(names[0], [1, 16], "FP32"), mod.InferInput(names[1], [1, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    return ins, a, b


def infer_http(url, model, headers=None, names=("INPUT0", "INPUT1")):
    ins, a, b = add_sub_inputs(httpclient, names)
    with httpclient.InferenceServerClient(url, network_timeout=60) as c:
        return c.infer(model, ins, headers=dict(headers) if headers else None), a, b


def check_bls_trace(spans, client_span):
    """The BLS request's whole trace: router > node A > bls_call > router > node B."""
    tree = Tree(spans)
    assert len({s["traceId"] for s in spans}) == 1
    roots = [s for s in spans if s["service"] == ROUTER_SERVICE and s["name"] == "InferRequest"]
    assert len(roots) == 2, roots
    root = next(r for r in roots if r["parentSpanId"] not in tree.by_id)
    check_router_root(root, client_span, "http")
    a_root = check_router_hop(tree, root, "bls_call", "A", NODE_A_SERVICE)
    bls = tree.child(a_root, "bls_call")
    call = tree.child(bls, "InferRequest")  # the BLS call, through the router
    check_router_root(call, bls["spanId"])
    check_router_hop(tree, call, "add_sub", "B", DEFAULT_NODE_SERVICE)
    assert len(tree.children(bls)) == 2, "bls_call's children: compute and the router's InferRequest"
    per_process = {svc: len([s for s in spans if s["service"] == svc])
                   for svc in (ROUTER_SERVICE, NODE_A_SERVICE, DEFAULT_NODE_SERVICE)}
    assert per_process == {ROUTER_SERVICE: 6, NODE_A_SERVICE: 3, DEFAULT_NODE_SERVICE: 3}, \
        [(s["service"], s["name"]) for s in spans]
    return tree


def node_repos(models_dir, tmp):
    a = copy_models(models_dir / "simple", tmp / "a", ["add_sub"], rename={"add_sub": "add_sub_x"})
    (a / "bls_call" / "1").mkdir(parents=True)
    (a / "bls_call" / "1" / "model.py").write_text(BLS_CALL)
    (a / "bls_call" / "config.pbtxt").write_text(BLS_CONFIG)
    return a, copy_models(models_dir / "simple", tmp / "b", ["add_sub"])


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    c = start_collector(tmp_path_factory.mktemp("otlp"))
    yield c
    c.stop()


@pytest.fixture(scope="module")
def cluster(module_cluster_factory, models_dir, tmp_path_factory, collector):
    """Router (rate 1, default service.name) with the `chain` ensemble; node A (bls_call, add_sub_x) and
    node B (add_sub), both traced at rate 1000: they trace a request from the router for its context."""
    tmp = tmp_path_factory.mktemp("trace-cluster")
    a_repo, b_repo = node_repos(models_dir, tmp)
    (tmp / "router" / "chain" / "1").mkdir(parents=True)
    (tmp / "router" / "chain" / "config.pbtxt").write_text(CHAIN)
    port = collector.server.server_address[1]
    c = module_cluster_factory("cl-trace")
    c.start_router([tmp / "router"], ["--model-control-mode", "explicit", "--router-name", ROUTER_NAME]
                   + trace_args(port))
    c.start_node("A", [a_repo], PY_ARGS + trace_args(port, rate=1000, service=NODE_A_SERVICE))
    c.start_node("B", [b_repo], trace_args(port, rate=1000))
    wait_until(lambda: c.router.get("/v2/models/chain/ready").status == 200, 60, "the ensemble to be planned")
    return c


def test_a_bls_request_with_a_client_context_is_one_trace_across_the_cluster(cluster, collector):
    header, trace_id, span_id = new_parent()
    r, a, b = infer_http(cluster.router.http_url, "bls_call", {"traceparent": header, "tracestate": "mesh=a1"})
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    spans = wait_trace(collector, trace_id, 12)
    check_bls_trace(spans, span_id)
    assert {s.get("traceState") for s in spans} == {"mesh=a1"}, "the client's tracestate travels with the context"


def test_without_a_client_context_the_router_starts_the_trace(cluster, collector):
    t0 = time.time_ns()
    infer_http(cluster.router.http_url, "bls_call")

    def root():
        found = [s for s in collected(collector) if s["service"] == ROUTER_SERVICE and s["name"] == "InferRequest"
                 and s["parentSpanId"] == "" and int(s["startTimeUnixNano"]) >= t0]
        assert len(found) <= 1, found
        return found[0] if found else None

    trace_id = wait_until(root, 30, "the router's root span of the request")["traceId"]
    spans = wait_trace(collector, trace_id, 12)
    check_bls_trace(spans, "")
    assert {s["service"] for s in spans} == {ROUTER_SERVICE, NODE_A_SERVICE, DEFAULT_NODE_SERVICE}


def test_a_grpc_stream_request_is_in_the_clients_trace(cluster, collector):
    header, trace_id, span_id = new_parent()
    answers = []
    client = grpcclient.InferenceServerClient(cluster.router.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.append(error or result),
                            headers={"traceparent": header})
        ins, a, b = add_sub_inputs(grpcclient)
        client.async_stream_infer("add_sub", ins)
        wait_until(lambda: answers, 30, "the stream's answer")
        client.stop_stream()
    finally:
        client.close()
    np.testing.assert_array_equal(answers[0].as_numpy("OUTPUT1"), a - b)
    spans = wait_trace(collector, trace_id, 6)
    tree = Tree(spans)
    (root,) = [s for s in spans if s["parentSpanId"] == span_id]
    check_router_root(root, span_id, "grpc")
    check_router_hop(tree, root, "add_sub", "B", DEFAULT_NODE_SERVICE)
    assert len(spans) == 6, [(s["service"], s["name"]) for s in spans]


def test_a_router_ensemble_has_its_span_and_a_route_per_step(cluster, collector):
    header, trace_id, span_id = new_parent()
    r, a, b = infer_http(cluster.router.http_url, "chain", {"traceparent": header}, names=("A", "B"))
    np.testing.assert_array_equal(r.as_numpy("TWICE_A"), 2 * a)
    spans = wait_trace(collector, trace_id, 12)
    tree = Tree(spans)
    (root,) = [s for s in spans if s["parentSpanId"] == span_id]
    check_router_root(root, span_id, "http")
    ensemble = tree.child(root, "chain")
    assert (ensemble["kind"], ensemble["service"]) == (INTERNAL, ROUTER_SERVICE), ensemble
    routes = tree.children(ensemble, "route")
    assert sorted(attrs(s)["triton.model_name"] for s in routes) == ["add_sub", "add_sub_x"], routes
    # check_router_hop finds the one `route` under a parent: check each step's under a view of its own.
    for route in routes:
        model = attrs(route)["triton.model_name"]
        step = Tree([s for s in spans if s["name"] != "route" or s["spanId"] == route["spanId"]])
        check_router_hop(step, ensemble, model, "A" if model == "add_sub_x" else "B",
                         NODE_A_SERVICE if model == "add_sub_x" else DEFAULT_NODE_SERVICE)
    assert len(spans) == 12, [(s["service"], s["name"]) for s in spans]


def test_with_the_router_untraced_the_nodes_trace_by_their_own_rules(cluster_factory, models_dir, tmp_path):
    """No trace flags on the router: it exports nothing; nodes at rate 1 still trace what they run."""
    collector = start_collector(tmp_path)
    try:
        port = collector.server.server_address[1]
        a_repo, b_repo = node_repos(models_dir, tmp_path)
        c = cluster_factory()
        c.start_router(args=["--router-name", ROUTER_NAME])
        c.start_node("A", [a_repo], PY_ARGS + trace_args(port, service=NODE_A_SERVICE))
        c.start_node("B", [b_repo], trace_args(port))
        header, _, _ = new_parent()
        r, a, b = infer_http(c.router.http_url, "bls_call", {"traceparent": header})
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)

        def both():
            spans = collected(collector)
            return spans if {NODE_A_SERVICE, DEFAULT_NODE_SERVICE} <= {s["service"] for s in spans} else None

        wait_until(both, 30, lambda: f"spans of both nodes; have {[(s['service'], s['name']) for s in collected(collector)]}")
        time.sleep(1.5)
        spans = collected(collector)
        assert {s["service"] for s in spans} == {NODE_A_SERVICE, DEFAULT_NODE_SERVICE}, \
            [(s["service"], s["scope"], s["name"]) for s in spans]
        assert "mesh-router" not in {s["scope"] for s in spans}
        for service, model in ((NODE_A_SERVICE, "bls_call"), (DEFAULT_NODE_SERVICE, "add_sub")):
            mine = [s for s in spans if s["service"] == service]
            tree = Tree(mine)
            (root,) = [s for s in mine if s["name"] == "InferRequest"]
            tree.child(tree.child(root, model), "compute")
            assert len(mine) == 3, [s["name"] for s in mine]
    finally:
        collector.stop()


def test_a_retried_request_has_an_attempt_span_per_try(cluster_factory, tmp_path):
    """Two nodes serve the gated sleep model; the one running the request is killed while it sleeps, and
    the router runs it again on the other: two `attempt` spans under one `route`."""
    collector = start_collector(tmp_path)
    gate = tmp_path / "gate"
    try:
        port = collector.server.server_address[1]
        repo = copy_models(PY_MODELS, tmp_path / "repo", ["sleep_py"])
        (repo / "sleep_py" / "1" / "model.py").write_text(GATED_SLEEP)
        c = cluster_factory()
        c.start_router(args=["--router-name", ROUTER_NAME] + trace_args(port))
        for name in ("p1", "p2"):
            c.start_node(name, [repo], PY_ARGS + ["--exit-timeout-secs", "120"] + trace_args(port, service=name))
        header, trace_id, span_id = new_parent()
        ins = [httpclient.InferInput("X", [1], "FP32"), httpclient.InferInput("MS", [1], "INT32")]
        ins[0].set_data_from_numpy(np.array([7.0], np.float32))
        ins[1].set_data_from_numpy(np.array([20_000], np.int32))
        http = httpclient.InferenceServerClient(c.router.http_url, network_timeout=120, concurrency=2)
        try:
            pending = http.async_infer("sleep_py", ins, parameters={"gate": str(gate)},
                                       headers={"traceparent": header})
            victim = wait_until(lambda: next((n["name"] for n in c.view()["nodes"] if n["inflight"] > 0), None),
                                60, "a node with the request in flight", 0.02)
            other = next(n for n in ("p1", "p2") if n != victim)
            c.nodes[victim].kill()
            gate.touch()
            assert pending.get_result().as_numpy("Y")[0] == 7.0
        finally:
            http.close()
        spans = wait_trace(collector, trace_id, 7)  # router: 2 + 2 attempts; the other node: 3
        tree = Tree(spans)
        (root,) = [s for s in spans if s["parentSpanId"] == span_id]
        check_router_root(root, span_id, "http")
        node_root = check_router_hop(tree, root, "sleep_py", other, other, attempts=2)
        first = next(s for s in spans if s["name"] == "attempt" and attrs(s)["mesh.attempt"] == "1")
        assert attrs(first)["mesh.node"] == victim, attrs(first)
        assert attrs(first)["mesh.outcome"].startswith("retried"), attrs(first)
        assert node_root["service"] == other and not [s for s in spans if s["service"] == victim]
        assert len(spans) == 7, [(s["service"], s["name"]) for s in spans]
    finally:
        gate.touch()
        collector.stop()
