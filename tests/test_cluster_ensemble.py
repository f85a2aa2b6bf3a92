"""Work that crosses nodes: router ensembles whose steps are served by different nodes (in a chain and
in parallel branches), and BLS from a Python model on one node to an ONNX model that only another
node serves (through the router). Node A serves add_sub_x (a renamed add_sub), bls_twice and
bls_async; node B serves add_sub; the router's own repository holds the ensembles."""
import json
import queue
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cluster_util import copy_models, shm_bytes, wait_until

pytestmark = [pytest.mark.server, pytest.mark.cluster]

PY_MODELS = Path(__file__).parent / "python_models"
PY_ARGS = ["--backend-config", f"python,interpreter={sys.executable}",
           "--backend-config", "python,execute-timeout-seconds=30"]

T16 = "data_type: TYPE_FP32 dims: [ 16 ]"


def step(model, inputs, outputs):
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    return f'{{ model_name: "{model}" model_version: -1 {" ".join(maps)} }}'


def write_ensemble(repo: Path, name, inputs, outputs, steps):
    (repo / name / "1").mkdir(parents=True)
    io = lambda names: ", ".join(f'{{ name: "{n}" {T16} }}' for n in names)
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        f'input [ {io(inputs)} ]\noutput [ {io(outputs)} ]\n'
        f'ensemble_scheduling {{ step [ {", ".join(steps)} ] }}\n')


def router_repo(repo: Path) -> Path:
    # chain: add_sub_x on A, then add_sub on B: (a+b)+(a-b) = 2a, (a+b)-(a-b) = 2b
    write_ensemble(repo, "chain", ["A", "B"], ["TWICE_A", "TWICE_B"], [
        step("add_sub_x", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "S", "OUTPUT1": "D"}),
        step("add_sub", {"INPUT0": "S", "INPUT1": "D"}, {"OUTPUT0": "TWICE_A", "OUTPUT1": "TWICE_B"}),
    ])
    # fork: two independent branches, one per node
    write_ensemble(repo, "fork", ["A", "B"], ["SUM_ON_A", "DIFF_ON_B"], [
        step("add_sub_x", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "SUM_ON_A"}),
        step("add_sub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT1": "DIFF_ON_B"}),
    ])
    # one decoupled step (repeat_py on A): each of its answers is an answer of the ensemble
    (repo / "repeat_router" / "1").mkdir(parents=True)
    (repo / "repeat_router" / "config.pbtxt").write_text(
        'name: "repeat_router"\nplatform: "ensemble"\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]\n'
        'ensemble_scheduling { step [ ' + step("repeat_py", {"IN": "IN"}, {"OUT": "OUT", "IDX": "IDX"}) + ' ] }\n')
    # a plain model in the router's repository: placed on the nodes only once loaded (explicit mode)
    copy_models(PY_MODELS, repo, ["add_sub_py"])
    return repo


BLS_IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            call = pb_utils.InferenceRequest(model_name="identity_fp32", inputs=[pb_utils.Tensor("INPUT0", x)],
                                             requested_output_names=["OUTPUT0"])
            answer = call.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            y = pb_utils.get_output_tensor_by_name(answer, "OUTPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return responses
"""


def write_bls_identity(repo: Path) -> None:
    """bls_identity: OUTPUT0 = identity_fp32(INPUT0), through one BLS call."""
    (repo / "bls_identity" / "1").mkdir(parents=True)
    (repo / "bls_identity" / "1" / "model.py").write_text(BLS_IDENTITY)
    (repo / "bls_identity" / "config.pbtxt").write_text(
        'name: "bls_identity"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')


@pytest.fixture(scope="module")
def cluster(module_cluster_factory, models_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster-ens")
    a_repo = copy_models(models_dir / "simple", tmp / "a", ["add_sub"], rename={"add_sub": "add_sub_x"})
    copy_models(PY_MODELS, a_repo, ["bls_twice", "bls_async", "repeat_py"])
    write_bls_identity(a_repo)
    b_repo = copy_models(models_dir / "simple", tmp / "b", ["add_sub"])
    copy_models(models_dir / "dtypes", b_repo, ["identity_fp32"])
    c = module_cluster_factory("cl-ens")
    c.start_router([router_repo(tmp / "router")], ["--model-control-mode", "explicit"])
    c.start_node("A", [a_repo], PY_ARGS)
    c.start_node("B", [b_repo])
    for name in ("chain", "repeat_router"):
        wait_until(lambda: c.router.get(f"/v2/models/{name}/ready").status == 200, 60, "the ensembles to be planned")
    return c


@pytest.fixture
def http(cluster):
    c = httpclient.InferenceServerClient(cluster.router.http_url, network_timeout=60)
    yield c
    c.close()


def inputs(mod, names, a, b):
    ins = [mod.InferInput(names[0], list(a.shape), "FP32"), mod.InferInput(names[1], list(b.shape), "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    return ins


def count(node, model):
    c = httpclient.InferenceServerClient(node.http_url)
    try:
        return int(c.get_inference_statistics(model)["model_stats"][0]["inference_count"])
    finally:
        c.close()


def counts(cluster):
    return {"A": count(cluster.nodes["A"], "add_sub_x"), "B": count(cluster.nodes["B"], "add_sub")}


def test_each_node_serves_only_its_models(cluster):
    view = {n["name"]: n for n in cluster.view()["nodes"]}
    assert sorted(view["A"]["models"]) == ["add_sub_x:1", "bls_async:1", "bls_identity:1", "bls_twice:1",
                                           "repeat_py:1"]
    assert sorted(view["B"]["models"]) == ["add_sub:1", "identity_fp32:1"]
    assert cluster.nodes["A"].get("/v2/models/add_sub/ready").status != 200
    assert cluster.nodes["B"].get("/v2/models/add_sub_x/ready").status != 200
    rows = {r["name"]: r for r in cluster.router.index()}
    assert rows["chain"]["state"] == "READY" and rows["fork"]["state"] == "READY"
    assert "add_sub_py" not in rows, "in explicit mode a plain model of the router's repository waits for a load"


@pytest.mark.parametrize("mod", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_chain_runs_its_steps_on_different_nodes(cluster, mod):
    c = mod.InferenceServerClient(cluster.router.http_url if mod is httpclient else cluster.router.grpc_url)
    try:
        before = counts(cluster)
        for k in range(5):
            a = (np.arange(32, dtype=np.float32).reshape(2, 16) + k)
            b = np.full((2, 16), 0.5 * k, np.float32)
            r = c.infer("chain", inputs(mod, ["A", "B"], a, b))
            np.testing.assert_array_equal(r.as_numpy("TWICE_A"), 2 * a)
            np.testing.assert_array_equal(r.as_numpy("TWICE_B"), 2 * b)
        after = counts(cluster)
        assert {k: after[k] - before[k] for k in after} == {"A": 10, "B": 10}, \
            "step 0 ran on node A and step 1 on node B, one batch of 2 each per request"
    finally:
        c.close()


def test_parallel_branches_run_on_different_nodes(cluster, http):
    before = counts(cluster)
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 3.0, np.float32)
    r = http.infer("fork", inputs(httpclient, ["A", "B"], a, b))
    np.testing.assert_array_equal(r.as_numpy("SUM_ON_A"), a + b)
    np.testing.assert_array_equal(r.as_numpy("DIFF_ON_B"), a - b)
    after = counts(cluster)
    assert {k: after[k] - before[k] for k in after} == {"A": 1, "B": 1}


def test_a_decoupled_step_streams_through_a_router_ensemble_and_one_answer_paths_refuse_it(cluster):
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(cluster.router.grpc_url)
    inp = grpcclient.InferInput("IN", [3], "INT32")
    inp.set_data_from_numpy(np.array([3, 5, 7], np.int32))
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    got = []
    try:
        client.async_stream_infer("repeat_router", [inp], enable_empty_final_response=True)
        while True:
            result, error = answers.get(timeout=30)
            assert error is None, error
            if result.as_numpy("OUT") is not None:
                got.append((int(result.as_numpy("IDX")[0]), int(result.as_numpy("OUT")[0])))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    assert sorted(got) == [(0, 3), (1, 5), (2, 7)]
    stats = cluster.router.get_json("/v2/models/repeat_router/stats")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 1, "the router counts a streamed ensemble"
    # ... and the console's history has it as a request of its own, beside its steps.
    def streamed_in_history():
        history = cluster.router.get_json("/mesh/v1/history")
        rows = {m["name"]: m for m in history["models"]}
        return "repeat_router" in rows and sum(rows["repeat_router"]["rps"]) > 0
    wait_until(streamed_in_history, 15, "the streamed router ensemble in the console's history")
    # As a node refuses it (tests/test_ensemble_stream.py): 501, naming the decoupled policy.
    body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}).encode()
    r = cluster.router.post("/v2/models/repeat_router/infer", body)
    assert r.status == 501, (r.status, r.body)
    assert "decoupled transaction policy" in json.loads(r.body)["error"]


def test_ensemble_metadata_and_statistics_through_the_router(http):
    md = http.get_model_metadata("chain")
    assert md["name"] == "chain" and [i["name"] for i in md["inputs"]] == ["A", "B"]
    assert [o["name"] for o in md["outputs"]] == ["TWICE_A", "TWICE_B"]
    assert http.get_model_config("chain")["platform"] == "ensemble"
    before = int(http.get_inference_statistics("chain")["model_stats"][0]["inference_count"])
    a = np.ones((1, 16), np.float32)
    http.infer("chain", inputs(httpclient, ["A", "B"], a, a))
    after = int(http.get_inference_statistics("chain")["model_stats"][0]["inference_count"])
    assert after - before == 1


def test_an_ensemble_rejects_a_bad_input_with_a_clear_error(http):
    a = np.ones((1, 15), np.float32)
    with pytest.raises(InferenceServerException) as e:
        http.infer("chain", inputs(httpclient, ["A", "B"], a, a))
    assert "chain" in str(e.value) or "shape" in str(e.value), str(e.value)


@pytest.mark.parametrize("via", ["router", "node A"])
def test_bls_on_node_a_calls_a_model_only_node_b_serves(cluster, via):
    """bls_twice (Python, node A) calls add_sub twice; only node B serves add_sub, so the calls leave
    A through the router. OUTPUT0 = INPUT0 + 2 * INPUT1."""
    url = cluster.router.http_url if via == "router" else cluster.nodes["A"].http_url
    c = httpclient.InferenceServerClient(url, network_timeout=60)
    try:
        before = count(cluster.nodes["B"], "add_sub")
        for k in range(3):
            a = np.arange(32, dtype=np.float32).reshape(2, 16) * (k + 1)
            b = np.full((2, 16), 0.25 + k, np.float32)
            r = c.infer("bls_twice", inputs(httpclient, ["INPUT0", "INPUT1"], a, b))
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + 2 * b)
        assert count(cluster.nodes["B"], "add_sub") - before == 12, "two calls of batch 2 per request, on B"
    finally:
        c.close()


def test_async_bls_across_nodes_and_a_missing_model_error(cluster, http):
    a = np.full((1, 16), 3.0, np.float32)
    b = np.ones((1, 16), np.float32)
    before = count(cluster.nodes["B"], "add_sub")
    r = http.infer("bls_async", inputs(httpclient, ["INPUT0", "INPUT1"], a, b))
    np.testing.assert_array_equal(r.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(r.as_numpy("DIFF"), a - b)
    message = r.as_numpy("MISSING_ERROR")[0, 0].decode()
    assert "no_such_model" in message, message
    assert count(cluster.nodes["B"], "add_sub") - before == 2


def test_a_large_bls_call_across_nodes_goes_through_shared_memory_both_ways(cluster, http):
    """bls_identity (node A) sends 1 MiB to identity_fp32, which only node B serves. Every process
    shares this host, so each hop's tensor goes through the receiver's arena: the client's request to
    A, A's BLS call to the router, the router's call to B, and the answers back the same way."""
    procs = {"router": cluster.router, "A": cluster.nodes["A"], "B": cluster.nodes["B"]}
    before = {k: shm_bytes(p) for k, p in procs.items()}
    x = np.arange(1 << 18, dtype=np.float32).reshape(1, -1)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_array_equal(http.infer("bls_identity", [inp]).as_numpy("OUTPUT0"), x)
    moved = {k: tuple(a - b for a, b in zip(shm_bytes(p), before[k])) for k, p in procs.items()}
    sent, received = 0, 1
    assert moved["A"][sent] >= 2 * x.nbytes and moved["A"][received] >= 2 * x.nbytes, moved  # BLS call + answer
    assert moved["B"][sent] >= x.nbytes and moved["B"][received] >= x.nbytes, moved
    assert moved["router"][sent] == moved["A"][received] + moved["B"][received], moved
    assert moved["router"][received] == moved["A"][sent] + moved["B"][sent], moved


def chain_row(cluster):
    return {x["name"]: x for x in cluster.router.index()}["chain"]


def test_an_ensemble_is_not_ready_while_a_step_node_is_lost(cluster, http):
    """Node B is killed: add_sub has no routable replica, so chain cannot run and must not say ready."""
    try:
        cluster.nodes["B"].kill()
        cluster.wait_not_routable("B")
        assert not http.is_model_ready("add_sub")
        wait_until(lambda: chain_row(cluster)["state"] != "READY", 30, "chain to become unavailable")
        assert "add_sub" in chain_row(cluster)["reason"]
        assert not http.is_model_ready("chain")
    finally:
        cluster.restart("B", kill=True)


def test_an_ensemble_runs_again_once_its_step_node_is_back(cluster, http):
    """Runs after B was killed and started again: the new B serves chain's second step."""
    if not cluster.nodes["B"].running():
        cluster.restart("B", kill=True)
    wait_until(lambda: http.is_model_ready("chain") and chain_row(cluster)["state"] == "READY", 60,
               "chain to be ready")
    a = np.ones((1, 16), np.float32)
    before = count(cluster.nodes["B"], "add_sub")
    r = http.infer("chain", inputs(httpclient, ["A", "B"], a, 2 * a))
    np.testing.assert_array_equal(r.as_numpy("TWICE_A"), 2 * a)
    np.testing.assert_array_equal(r.as_numpy("TWICE_B"), 4 * a)
    assert count(cluster.nodes["B"], "add_sub") - before == 1
