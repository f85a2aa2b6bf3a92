"""Sequence batching (issue 15): stateful models with `sequence_batching`. Requests carry
`sequence_id` (integer or string), `sequence_start` and `sequence_end` as tritonclient sends them;
the node adds the control inputs (START, END, READY, CORRID) and carries ONNX implicit state from
one request of a sequence to the next, one request of a sequence at a time, in order, on the
instance that holds it. Through the router a sequence stays on its node; a lost node's sequences
fail with a clear error and are never restarted elsewhere."""
import queue
import shutil
import threading
import time
from functools import partial

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.server]

# seq_short_idle's max_sequence_idle_microseconds.
SHORT_IDLE_US = 2_000_000

ACCUMULATE_CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle}
  oldest {{ max_candidate_sequences: 8 max_queue_delay_microseconds: 2000 }}
  state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
}}
"""

CONTROLS_CONFIG = """name: "seq_controls"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "CORR" data_type: TYPE_UINT64 dims: [ 1 ] } ]
sequence_batching {
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"""


def _save(model_dir, graph_nodes, inputs, outputs, consts=()):
    graph = helper.make_graph(graph_nodes, "seq", inputs, outputs,
                              initializer=[numpy_helper.from_array(np.asarray(v), name=n) for n, v in consts])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    (model_dir / "1").mkdir(parents=True)
    onnx.save(model, str(model_dir / "1" / "model.onnx"))


def accumulate_model(root, name, idle_us):
    """OUTPUT = INPUT + STATE_IN; STATE_OUT = OUTPUT: a running sum the server carries as state."""
    f = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 1])
    _save(root / name, [helper.make_node("Add", ["INPUT", "STATE_IN"], ["OUTPUT"]),
                        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"])],
          [f("INPUT"), f("STATE_IN")], [f("OUTPUT"), f("STATE_OUT")])
    (root / name / "config.pbtxt").write_text(ACCUMULATE_CONFIG.format(name=name, idle=idle_us))


def controls_model(root):
    """OUTPUT = INPUT + 1000*START + 100*END + 10*READY; CORR = CORRID."""
    i32 = lambda n: helper.make_tensor_value_info(n, TensorProto.INT32, ["batch", 1])
    u64 = lambda n: helper.make_tensor_value_info(n, TensorProto.UINT64, ["batch", 1])
    nodes = [helper.make_node("Mul", ["START", "k1000"], ["s"]), helper.make_node("Mul", ["END", "k100"], ["e"]),
             helper.make_node("Mul", ["READY", "k10"], ["r"]), helper.make_node("Add", ["INPUT", "s"], ["a1"]),
             helper.make_node("Add", ["a1", "e"], ["a2"]), helper.make_node("Add", ["a2", "r"], ["OUTPUT"]),
             helper.make_node("Identity", ["CORRID"], ["CORR"])]
    consts = [("k1000", np.int32(1000)), ("k100", np.int32(100)), ("k10", np.int32(10))]
    _save(root / "seq_controls", nodes, [i32("INPUT"), i32("START"), i32("END"), i32("READY"), u64("CORRID")],
          [i32("OUTPUT"), u64("CORR")], consts)
    (root / "seq_controls" / "config.pbtxt").write_text(CONTROLS_CONFIG)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("sequence") / "repo"
    accumulate_model(root, "seq_accumulate", 5_000_000)
    accumulate_model(root, "seq_short_idle", SHORT_IDLE_US)
    controls_model(root)
    return root


@pytest.fixture(scope="module")
def node(server_factory, repo):
    return server_factory([repo], name="sequence")


def step(client, mod, model, value, seq, start=False, end=False, dtype="FP32"):
    i = mod.InferInput("INPUT", [1, 1], dtype)
    i.set_data_from_numpy(np.array([[value]], dtype=np.float32 if dtype == "FP32" else np.int32))
    r = client.infer(model, [i], sequence_id=seq, sequence_start=start, sequence_end=end)
    return r


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_implicit_state_carries_a_running_sum_per_sequence(node, proto):
    mod = httpclient if proto == "http" else grpcclient
    c = mod.InferenceServerClient(node.http_url if proto == "http" else node.grpc_url)
    seqs = {1001: [1, 2, 3, 4], f"user-{proto}": [10, 20, 30, 40]}  # an integer and a string id, interleaved
    sums = {s: 0.0 for s in seqs}
    for k in range(4):
        for seq, values in seqs.items():
            r = step(c, mod, "seq_accumulate", values[k], seq, start=k == 0, end=k == 3)
            sums[seq] += values[k]
            assert r.as_numpy("OUTPUT")[0][0] == sums[seq], (seq, k)
            assert r.as_numpy("STATE_OUT") is None, "the state is the server's, not an output"
    # A new START begins from the initial (zero) state again.
    assert step(c, mod, "seq_accumulate", 5, 1001, start=True, end=True).as_numpy("OUTPUT")[0][0] == 5
    c.close()


def test_control_inputs_reach_the_model(node):
    c = httpclient.InferenceServerClient(node.http_url)
    first = step(c, httpclient, "seq_controls", 1, 77, start=True, dtype="INT32")
    middle = step(c, httpclient, "seq_controls", 1, 77, dtype="INT32")
    last = step(c, httpclient, "seq_controls", 1, 77, end=True, dtype="INT32")
    assert [int(r.as_numpy("OUTPUT")[0][0]) for r in (first, middle, last)] == [1011, 11, 111]
    assert all(int(r.as_numpy("CORR")[0][0]) == 77 for r in (first, middle, last))
    c.close()


def test_sequence_errors_are_clear_and_lose_nothing(node):
    c = httpclient.InferenceServerClient(node.http_url)

    def fails(want, **kw):
        with pytest.raises(InferenceServerException) as e:
            step(c, httpclient, **kw)
        assert want in str(e.value), e.value

    fails("must specify a non-zero or non-empty correlation ID", model="seq_accumulate", value=1, seq=0)
    fails("must specify the START flag on the first request", model="seq_accumulate", value=1, seq=4242)
    step(c, httpclient, "seq_accumulate", 1, 4243, start=True, end=True)
    fails("must specify the START flag", model="seq_accumulate", value=1, seq=4243)  # it ended
    fails("takes integer correlation IDs", model="seq_controls", value=1, seq="text", start=True, dtype="INT32")
    i = httpclient.InferInput("INPUT", [2, 1], "FP32")
    i.set_data_from_numpy(np.ones((2, 1), np.float32))
    with pytest.raises(InferenceServerException) as e:
        c.infer("seq_accumulate", [i], sequence_id=9, sequence_start=True)
    assert "must specify batch-size 1" in str(e.value)
    # A request refused (a wrong shape) leaves its sequence as it was; a request that fails after
    # its turn came is the sequence table's unit test (Step dropped unfinished keeps the state).
    step(c, httpclient, "seq_accumulate", 2, 4244, start=True)
    bad = httpclient.InferInput("INPUT", [1, 2], "FP32")
    bad.set_data_from_numpy(np.ones((1, 2), np.float32))
    with pytest.raises(InferenceServerException):
        c.infer("seq_accumulate", [bad], sequence_id=4244)
    assert step(c, httpclient, "seq_accumulate", 3, 4244, end=True).as_numpy("OUTPUT")[0][0] == 5
    c.close()


def test_an_idle_sequence_is_released(node):
    """The second request follows the first at once (far within the 2 s idle limit, even on a busy
    machine); after a wait longer than the limit the sequence is gone."""
    c = httpclient.InferenceServerClient(node.http_url)
    step(c, httpclient, "seq_short_idle", 1, 5, start=True)
    assert step(c, httpclient, "seq_short_idle", 1, 5).as_numpy("OUTPUT")[0][0] == 2
    time.sleep(SHORT_IDLE_US / 1e6 * 1.25)  # longer than max_sequence_idle_microseconds
    with pytest.raises(InferenceServerException) as e:
        step(c, httpclient, "seq_short_idle", 1, 5)
    assert "idle longer than max_sequence_idle_microseconds" in str(e.value)
    c.close()


def test_a_grpc_stream_runs_each_sequence_in_order(node):
    """Requests sent without waiting: each sequence's answers are its running sums, in order."""
    answers = queue.Queue()
    c = grpcclient.InferenceServerClient(node.grpc_url)
    c.start_stream(callback=lambda result, error: answers.put((result, error)))
    n = 25
    for k in range(n):
        for seq in (31, 32, 33):
            i = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            i.set_data_from_numpy(np.array([[k + 1]], np.float32))
            c.async_stream_infer("seq_accumulate", [i], request_id=f"{seq}-{k}", sequence_id=seq,
                                 sequence_start=k == 0, sequence_end=k == n - 1)
    got = {}
    for _ in range(3 * n):
        result, error = answers.get(timeout=30)
        assert error is None, error
        seq, k = map(int, result.get_response().id.split("-"))
        got[(seq, k)] = result.as_numpy("OUTPUT")[0][0]
    c.stop_stream()
    c.close()
    for seq in (31, 32, 33):
        assert [got[(seq, k)] for k in range(n)] == [sum(range(1, k + 2)) for k in range(n)], seq


def run_sequence(url, seq, n, errors):
    try:
        c = httpclient.InferenceServerClient(url)
        total = 0.0
        for k in range(n):
            total += seq + k
            r = step(c, httpclient, "seq_accumulate", seq + k, seq, start=k == 0, end=k == n - 1)
            assert r.as_numpy("OUTPUT")[0][0] == total, (seq, k)
        c.close()
    except Exception as e:  # noqa: BLE001 - reported to the test thread
        errors.append(e)


def run_concurrently(url, seqs, n=15):
    errors = []
    threads = [threading.Thread(target=run_sequence, args=(url, s, n, errors)) for s in seqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors[:3]


def test_concurrent_sequences_keep_their_own_state(node):
    before = node.get_json("/v2/models/seq_accumulate/stats")["model_stats"][0]["inference_count"]
    run_concurrently(node.http_url, range(200, 208))
    after = node.get_json("/v2/models/seq_accumulate/stats")["model_stats"][0]["inference_count"]
    assert after - before == 8 * 15


@pytest.mark.cluster
def test_through_the_router_a_sequence_stays_on_its_node_and_fails_clearly_when_it_is_lost(cluster_factory, repo,
                                                                                           tmp_path):
    models = tmp_path / "models"
    shutil.copytree(repo / "seq_accumulate", models / "seq_accumulate")
    cl = cluster_factory()
    cl.start_router()
    nodes = [cl.start_node(f"n{i}", [models]) for i in (1, 2)]
    run_concurrently(cl.router.http_url, range(300, 306), n=6)
    # Every request of a sequence ran where it started (else the sums above would be wrong); now
    # start one, find its node, and kill that node.
    c = httpclient.InferenceServerClient(cl.router.http_url)
    counts = lambda: [n.get_json("/v2/models/seq_accumulate/stats")["model_stats"][0]["inference_count"]
                      for n in nodes]
    before = counts()
    step(c, httpclient, "seq_accumulate", 1, 777, start=True)
    holder = next(i for i, (b, a) in enumerate(zip(before, counts())) if a > b)
    nodes[holder].kill()
    with pytest.raises(InferenceServerException) as e:
        for _ in range(50):  # until the router has noticed the loss
            step(c, httpclient, "seq_accumulate", 1, 777)
            time.sleep(0.1)
    assert "START" in str(e.value) or "sequence" in str(e.value), e.value
    # Never restarted elsewhere silently: the sequence must be started again, and then it works.
    r = step(c, httpclient, "seq_accumulate", 4, 777, start=True, end=True)
    assert r.as_numpy("OUTPUT")[0][0] == 4
    c.close()


ONE_SEQUENCE_PER_INSTANCE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    # Like Triton's qa sequence models, the running sum lives in the instance: correct only if the
    # instance holds one sequence at a time (max_batch_size 0: one slot).
    def initialize(self, args):
        self.open, self.total = None, 0

    def execute(self, requests):
        out = []
        for r in requests:
            cid, flags = r.correlation_id(), r.flags()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                if self.open is not None:
                    raise pb_utils.TritonModelException(f"sequence {cid} started while {self.open} is open here")
                self.open, self.total = cid, 0
            elif self.open != cid:
                raise pb_utils.TritonModelException(f"sequence {cid} reached an instance holding {self.open}")
            self.total += int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0])
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", np.array([self.total], np.int32))]))
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                self.open = None
        return out
"""


def test_an_instance_holds_one_sequence_per_slot_and_the_rest_wait(server_factory, tmp_path):
    """Triton's L0_sequence_batcher test_backlog: five sequences at once on a model with two
    instances and no batching (one slot each): three wait in the backlog until a sequence ends, so
    the model, which keeps its sum in the instance, never sees two sequences interleaved."""
    import sys
    repo = tmp_path / "repo"
    (repo / "slots_py" / "1").mkdir(parents=True)
    (repo / "slots_py" / "1" / "model.py").write_text(ONE_SEQUENCE_PER_INSTANCE)
    (repo / "slots_py" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'instance_group [ { count: 2 kind: KIND_CPU } ]\n'
        'sequence_batching { max_sequence_idle_microseconds: 30000000 }\n')
    srv = server_factory([repo], ["--backend-config", f"python,interpreter={sys.executable}"],
                         name="sequence-slots", wait_models=["slots_py"])
    sums, errors = {}, []

    def run(seq):
        c = grpcclient.InferenceServerClient(srv.grpc_url)
        got = []
        try:
            for k, value in enumerate((1, 2, 3)):
                x = grpcclient.InferInput("X", [1], "INT32")
                x.set_data_from_numpy(np.array([value], np.int32))
                r = c.infer("slots_py", [x], sequence_id=seq, sequence_start=k == 0, sequence_end=k == 2,
                            client_timeout=60)
                got.append(int(r.as_numpy("SUM")[0]))
                time.sleep(0.1)
            sums[seq] = got
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(f"{seq}: {e}")
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(seq,)) for seq in range(1001, 1006)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [], errors
    assert sums == {seq: [1, 3, 6] for seq in range(1001, 1006)}
