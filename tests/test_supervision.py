"""Supervision on a real failure: the backend panics (the test-only `fault-injection` build, see
crates/node/Cargo.toml), the instance's supervisor rebuilds its session with backoff, the sibling
instance keeps serving meanwhile, and later requests succeed. Needs MESH_FAULT_BIN."""
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from test_scheduling import ADD_SUB_IO, add_sub_inputs, make_repo

pytestmark = [pytest.mark.server]


@pytest.fixture
def fault_server(server_env, models_dir, tmp_path, request):
    import conftest
    path = os.environ.get("MESH_FAULT_BIN")
    if not path:
        if os.environ.get("MESH_REQUIRE_SERVER") == "1":
            pytest.fail("MESH_FAULT_BIN is not set (cargo build -p mesh-node --features fault-injection)")
        pytest.skip("MESH_FAULT_BIN is not set")
    binary = Path(path) if Path(path).is_absolute() else conftest.REPO_ROOT / path
    repo = make_repo(tmp_path, models_dir, "add_sub", "fragile",
                     "max_batch_size: 8\n" + ADD_SUB_IO + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"
                     'parameters { key: "mesh_fault_panic_on_batch" value: { string_value: "3" } }')
    # "brittle": its instance actor (not the backend) panics on a 5-row request; dynamic batching
    # with a delay keeps every request on the actor's path.
    brittle = make_repo(tmp_path, models_dir, "add_sub", "brittle",
                        "max_batch_size: 8\n" + ADD_SUB_IO + "dynamic_batching { max_queue_delay_microseconds: 100 }\n"
                        'parameters { key: "mesh_fault_panic_actor_on_rows" value: { string_value: "5" } }')
    factory = conftest._Factory(binary, server_env, request.node.name)
    yield factory([repo, brittle])
    factory.close()


def metric_values(text, name, model):
    return [float(m.group(1)) for m in re.finditer(name + r'\{[^}]*model="' + model + r'"[^}]*\} (\S+)', text)]


def test_failed_instance_is_restarted_and_siblings_keep_serving(fault_server):
    srv = fault_server
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            c.infer("fragile", add_sub_inputs(1.0, rows=3))
        assert "restarting" in str(e.value)
        # the other instance serves while the failed one restarts
        for _ in range(4):
            out = c.infer("fragile", add_sub_inputs(1.0)).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, np.full((1, 16), 2.0, np.float32))
        assert c.is_model_ready("fragile")
        end = time.time() + 20
        while time.time() < end:
            text = srv.metrics()
            if sum(metric_values(text, "mesh_instance_restarts_total", "fragile")) == 1 and \
                    metric_values(text, "mesh_instance_ready", "fragile") == [1.0, 1.0]:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the instance was not restarted:\n{srv.log_tail()}")
        log = srv.log_tail(200)
        assert "instance failed; restarting" in log and "instance restarted" in log
        for k in range(6):  # both instances take work again
            out = c.infer("fragile", add_sub_inputs(float(k), rows=2)).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, np.full((2, 16), k + 1.0, np.float32))
        executions = metric_values(srv.metrics(), "mesh_instance_executions_total", "fragile")
        assert len(executions) == 2 and all(v > 0 for v in executions), executions
    finally:
        c.close()


def test_a_dead_instance_actor_is_started_again(fault_server):
    srv = fault_server
    c = httpclient.InferenceServerClient(srv.http_url)
    try:
        out = c.infer("brittle", add_sub_inputs(1.0)).as_numpy("OUTPUT0")
        np.testing.assert_array_equal(out, np.full((1, 16), 2.0, np.float32))
        with pytest.raises(InferenceServerException) as e:
            c.infer("brittle", add_sub_inputs(1.0, rows=5))
        assert "stopped" in str(e.value)
        end = time.time() + 20
        while "instance actor started again" not in srv.log_tail(100):
            if time.time() > end:
                pytest.fail(f"the instance actor was not restarted:\n{srv.log_tail()}")
            time.sleep(0.1)
        for k in range(4):  # the new actor serves, batching as before
            out = c.infer("brittle", add_sub_inputs(float(k), rows=2)).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, np.full((2, 16), k + 1.0, np.float32))
        assert c.is_model_ready("brittle")
        assert "instance actor failed" in srv.log_tail(100)
    finally:
        c.close()
