"""Model control through tritonclient: explicit load/unload (HTTP and gRPC), config and file overrides,
reloads under traffic, and poll mode picking up new models and versions."""
import json
import re
import shutil
import sys
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.server]


def add_sub_infer(client, rows=1, model="add_sub"):
    ins = [httpclient.InferInput("INPUT0", [rows, 16], "FP32"), httpclient.InferInput("INPUT1", [rows, 16], "FP32")]
    for i in ins:
        i.set_data_from_numpy(np.ones((rows, 16), np.float32))
    out = client.infer(model, ins).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, np.full((rows, 16), 2.0, np.float32))


def wait_for(pred, what, timeout=20.0):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def explicit_server(fresh_server, models_dir, tmp_path):
    repo = tmp_path / "repo"
    for m in ("add_sub", "mlp", "auto_batched"):
        shutil.copytree(models_dir / "simple" / m, repo / m)
    shutil.copytree(models_dir / "broken" / "bad_field", repo / "bad_field")
    return fresh_server([repo], ["--model-control-mode", "explicit", "--load-model", "add_sub"],
                        wait_models=["add_sub"])


def test_explicit_load_and_unload_over_http_and_grpc(explicit_server):
    srv = explicit_server
    http = httpclient.InferenceServerClient(srv.http_url)
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        index = {r["name"]: r for r in http.get_model_repository_index()}
        assert set(index) == {"add_sub", "mlp", "auto_batched", "bad_field"}
        assert index["add_sub"]["state"] == "READY"
        assert index["mlp"].get("state", "") == ""
        assert not http.is_model_ready("mlp")
        assert "model_repository" in http.get_server_metadata()["extensions"]

        http.load_model("mlp")
        assert http.is_model_ready("mlp")
        grpc.load_model("auto_batched")
        assert grpc.is_model_ready("auto_batched")

        http.unload_model("mlp")
        assert not http.is_model_ready("mlp")
        row = next(r for r in http.get_model_repository_index() if r["name"] == "mlp")
        assert row["state"] == "UNAVAILABLE" and row["reason"] == "unloaded"
        grpc.unload_model("auto_batched")
        assert not grpc.is_model_ready("auto_batched")
        add_sub_infer(http)  # the others keep serving
    finally:
        http.close()
        grpc.close()


def test_load_errors_name_the_problem(explicit_server):
    http = httpclient.InferenceServerClient(explicit_server.http_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            http.load_model("bad_field")
        assert "foo_bar" in str(e.value)
        with pytest.raises(InferenceServerException) as e:
            http.load_model("no_such_model")
        assert "no_such_model" in str(e.value)
        with pytest.raises(InferenceServerException) as e:
            http.load_model("add_sub", config='{"name": "add_sub", "bogus_field": 1}')
        assert "bogus_field" in str(e.value)
        add_sub_infer(http)  # a failed reload keeps the serving version
    finally:
        http.close()


def test_config_override_replaces_config_pbtxt(explicit_server):
    http = httpclient.InferenceServerClient(explicit_server.http_url)
    try:
        cfg = http.get_model_config("add_sub")
        cfg["max_batch_size"] = 2
        http.load_model("add_sub", config=json.dumps(cfg))
        assert http.get_model_config("add_sub")["max_batch_size"] == 2
        add_sub_infer(http, rows=2)
        with pytest.raises(InferenceServerException) as e:
            add_sub_infer(http, rows=3)
        assert "batch size 3" in str(e.value)
    finally:
        http.close()


def test_file_override_serves_a_model_the_repository_lacks(explicit_server, models_dir):
    http = httpclient.InferenceServerClient(explicit_server.http_url)
    grpc = grpcclient.InferenceServerClient(explicit_server.grpc_url)
    try:
        onnx = (models_dir / "simple" / "add_sub" / "1" / "model.onnx").read_bytes()
        cfg = http.get_model_config("add_sub")
        cfg["name"] = "uploaded"
        http.load_model("uploaded", config=json.dumps(cfg), files={"file:1/model.onnx": onnx})
        add_sub_infer(http, model="uploaded")
        cfg["name"] = "uploaded_grpc"
        grpc.load_model("uploaded_grpc", config=json.dumps(cfg), files={"file:1/model.onnx": onnx})
        add_sub_infer(http, model="uploaded_grpc")
        with pytest.raises(InferenceServerException) as e:
            http.load_model("evil", config=json.dumps(cfg | {"name": "evil"}), files={"file:../../x": b"x"})
        assert "inside the model" in str(e.value)
    finally:
        http.close()
        grpc.close()


def test_reload_under_traffic_fails_no_request(explicit_server):
    srv = explicit_server
    stop = threading.Event()
    errors, count = [], [0]

    def traffic():
        c = httpclient.InferenceServerClient(srv.http_url)
        try:
            while not stop.is_set():
                try:
                    add_sub_infer(c)
                    count[0] += 1
                except Exception as e:  # noqa: BLE001 - collected for the assertion
                    errors.append(e)
        finally:
            c.close()

    threads = [threading.Thread(target=traffic) for _ in range(3)]
    for t in threads:
        t.start()
    http = httpclient.InferenceServerClient(srv.http_url)
    try:
        # The reloads start once traffic flows (however long the threads take to get going), and the
        # traffic goes on until they are done: every reload happens under it.
        wait_for(lambda: count[0] > 0 or errors, "the first answers of the traffic", timeout=60)
        for _ in range(5):
            http.load_model("add_sub")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        http.close()
    assert not errors, errors[:3]
    assert count[0] > 0


def test_concurrent_loads_and_unloads_stay_consistent(explicit_server):
    srv = explicit_server

    def churn(name):
        c = httpclient.InferenceServerClient(srv.http_url)
        try:
            for _ in range(3):
                c.load_model(name)
                c.unload_model(name)
            c.load_model(name)
        finally:
            c.close()

    threads = [threading.Thread(target=churn, args=(m,)) for m in ("mlp", "auto_batched", "mlp", "auto_batched")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    http = httpclient.InferenceServerClient(srv.http_url)
    try:
        assert http.is_model_ready("mlp") and http.is_model_ready("auto_batched")
        add_sub_infer(http)
    finally:
        http.close()


SLOW_INIT_PY = b"""
import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(4)

    def execute(self, requests):
        return []
"""


def test_a_flood_of_loads_is_refused_beyond_the_waiting_bound(fresh_server, models_dir, tmp_path):
    """Load and unload requests wait in the repository manager's mailbox, one change at a time: at
    most 16 may wait (the one running counts); more are refused at once as overload (503), and the
    ones admitted all complete."""
    repo = tmp_path / "repo"
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    srv = fresh_server([repo], ["--model-control-mode", "explicit", "--load-model", "add_sub",
                                "--backend-config", f"python,interpreter={sys.executable}"],
                       wait_models=["add_sub"])
    cfg = {"name": "slow_init", "backend": "python", "max_batch_size": 0,
           "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
           "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}]}
    body = json.dumps({"parameters": {"config": json.dumps(cfg),
                                      "file:1/model.py": __import__("base64").b64encode(SLOW_INIT_PY).decode()}})
    slow = []
    loader = threading.Thread(target=lambda: slow.append(srv.post("/v2/repository/models/slow_init/load", body.encode())))
    loader.start()

    time.sleep(1.0)  # the slow load reaches the manager; its initialize takes 4 s
    answers = [None] * 30

    def load_add_sub(i):
        answers[i] = srv.post("/v2/repository/models/add_sub/load", b"{}")

    flood = [threading.Thread(target=load_add_sub, args=(i,)) for i in range(30)]
    for t in flood:
        t.start()
    for t in flood:
        t.join(timeout=120)
    loader.join(timeout=60)
    assert slow and slow[0].status == 200, slow
    statuses = sorted(a.status for a in answers)
    refused = [a for a in answers if a.status == 503]
    # The slow load holds one place: 15 of the 30 may wait behind it, the others are refused.
    assert len(refused) == 15 and statuses.count(200) == 15, statuses
    assert all(b"already waiting for the repository manager" in a.body for a in refused), refused[0].body
    http = httpclient.InferenceServerClient(srv.http_url)
    try:
        add_sub_infer(http)
        assert http.is_model_ready("slow_init")
    finally:
        http.close()


def test_load_is_refused_outside_explicit_mode(fresh_server, add_sub_repo):
    srv = fresh_server([add_sub_repo])
    r = srv.post("/v2/repository/models/add_sub/load", b"{}")
    # tritonserver's answer, code and words: 503 / UNAVAILABLE
    assert r.status == 503, r
    assert r.error_message() == "explicit model load / unload is not allowed if polling is enabled"


def test_poll_mode_picks_up_new_models_and_versions(fresh_server, models_dir, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    v = repo / "versioned_latest"
    v.mkdir()
    shutil.copy(models_dir / "simple" / "versioned_latest" / "config.pbtxt", v / "config.pbtxt")
    shutil.copytree(models_dir / "simple" / "versioned_latest" / "1", v / "1")
    srv = fresh_server([repo], ["--model-control-mode", "poll", "--repository-poll-secs", "1"],
                       wait_models=["add_sub", "versioned_latest"])
    http = httpclient.InferenceServerClient(srv.http_url)
    try:
        assert http.get_model_metadata("versioned_latest")["versions"] == ["1"]
        shutil.copytree(models_dir / "simple" / "mlp", repo / "mlp")
        shutil.copytree(models_dir / "simple" / "versioned_latest" / "2", v / "2")
        wait_for(lambda: http.is_model_ready("mlp"), "poll mode to load the new model")
        wait_for(lambda: http.get_model_metadata("versioned_latest")["versions"] == ["2"], "poll mode to serve version 2")
        shutil.rmtree(repo / "mlp")
        wait_for(lambda: not http.is_model_ready("mlp"), "poll mode to unload the removed model")
        add_sub_infer(http)
    finally:
        http.close()


def inference_count(client, model="add_sub"):
    return int(client.get_inference_statistics(model)["model_stats"][0]["inference_count"])


def executions_by_instance(srv, model="add_sub"):
    found = re.finditer(r'mesh_instance_executions_total\{([^}]*)\} (\S+)', srv.metrics())
    out = {}
    for m in found:
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("model") == model:
            out[labels["instance"]] = float(m.group(2))
    return out


def test_instance_count_change_applies_in_place(explicit_server):
    """Only instance_group changed: instances are added or removed without reloading the model,
    so its statistics carry on; any other change is a full reload with fresh statistics."""
    srv = explicit_server
    http = httpclient.InferenceServerClient(srv.http_url)
    try:
        for _ in range(3):
            add_sub_infer(http)
        cfg = http.get_model_config("add_sub")
        cfg["instance_group"] = [{"count": 3, "kind": "KIND_CPU"}]
        http.load_model("add_sub", config=json.dumps(cfg))
        assert http.get_model_config("add_sub")["instance_group"][0]["count"] == 3
        assert inference_count(http) == 3, "growing the instance count must not reload the model"
        assert "instances changed in place" in srv.log_tail(50)
        for _ in range(6):
            add_sub_infer(http)
        grown = executions_by_instance(srv)
        assert {"add_sub_0_0_v1", "add_sub_0_1_v1", "add_sub_0_2_v1"} <= set(grown), grown
        assert grown["add_sub_0_2_v1"] > 0, f"the new instance takes work: {grown}"

        cfg["instance_group"] = [{"count": 1, "kind": "KIND_CPU"}]
        http.load_model("add_sub", config=json.dumps(cfg))
        assert inference_count(http) == 9
        for _ in range(4):
            add_sub_infer(http)
        shrunk = executions_by_instance(srv)
        assert shrunk["add_sub_0_1_v1"] == grown["add_sub_0_1_v1"], "a removed instance takes no work"
        assert shrunk["add_sub_0_2_v1"] == grown["add_sub_0_2_v1"], "a removed instance takes no work"
        assert shrunk["add_sub_0_0_v1"] == grown["add_sub_0_0_v1"] + 4

        cfg["max_batch_size"] = 4
        http.load_model("add_sub", config=json.dumps(cfg))
        assert inference_count(http) == 0, "a change beyond instance_group reloads the model"
    finally:
        http.close()


def test_poll_mode_applies_an_instance_count_edit_in_place(fresh_server, models_dir, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    srv = fresh_server([repo], ["--model-control-mode", "poll", "--repository-poll-secs", "1"],
                       wait_models=["add_sub"])
    http = httpclient.InferenceServerClient(srv.http_url)
    try:
        add_sub_infer(http)
        add_sub_infer(http)
        config = repo / "add_sub" / "config.pbtxt"
        config.write_text(config.read_text() + "\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n")
        wait_for(lambda: (http.get_model_config("add_sub").get("instance_group") or [{}])[0].get("count") == 2,
                 "poll mode to apply the new instance count")
        assert inference_count(http) == 2, "the edit must apply in place, keeping statistics"
        add_sub_infer(http)
    finally:
        http.close()
