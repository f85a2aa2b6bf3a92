"""Triton's classification extension (issue 15): an output asked for with a class count comes back as
its top classes, "value:index[:label]" BYTES strings, highest first, over HTTP (JSON and binary)
and gRPC, on a node and through the router, for a batched model with a label file and for the ONNX
DenseNet of Triton's Quick Deploy tutorial served with no config.pbtxt."""
import os
import re
import shutil

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from cluster_util import add_sub_inputs, wait_until

pytestmark = [pytest.mark.server]

LABELS = [f"class-{i}" for i in range(12)]  # fewer labels than OUTPUT0's 16 classes
DENSENET = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/light_densenet121.onnx")


@pytest.fixture(scope="module")
def repo(models_dir, tmp_path_factory):
    """add_sub whose OUTPUT0 has a label file, and the tutorial's DenseNet with no config."""
    root = tmp_path_factory.mktemp("classify") / "repo"
    shutil.copytree(models_dir / "simple" / "add_sub", root / "add_sub",
                    ignore=shutil.ignore_patterns("notes", "not_a_version"))
    cfg = root / "add_sub" / "config.pbtxt"
    cfg.write_text(re.sub(r'(name: "OUTPUT0"\n)', r'\1    label_filename: "labels.txt"\n', cfg.read_text()))
    (root / "add_sub" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    write_ensemble(root)
    write_ensemble(root, bare=True)
    (root / "densenet_onnx" / "1").mkdir(parents=True)
    shutil.copy(DENSENET, root / "densenet_onnx" / "1" / "model.onnx")
    return root


ENSEMBLE = """name: "add_sub_ens"
platform: "ensemble"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] label_filename: "labels.txt" } ]
ensemble_scheduling { step [ { model_name: "add_sub" model_version: -1
  input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
  output_map { key: "OUTPUT0" value: "SUM" } } ] }
"""


def write_ensemble(root, bare=False):
    """add_sub_ens: add_sub's sum as the ensemble's output SUM, with the ensemble's own labels (or
    add_sub_bare: the same with no label file, so SUM takes add_sub's OUTPUT0 labels)."""
    name = "add_sub_bare" if bare else "add_sub_ens"
    (root / name / "1").mkdir(parents=True)
    text = ENSEMBLE.replace('name: "add_sub_ens"', f'name: "{name}"')
    if bare:
        text = text.replace(' label_filename: "labels.txt"', "")
    (root / name / "config.pbtxt").write_text(text)
    if not bare:
        (root / name / "labels.txt").write_text("\n".join(f"sum-{i}" for i in range(16)))


def ensemble_top(url, k, model="add_sub_ens") -> tuple[list[list[str]], np.ndarray]:
    c = httpclient.InferenceServerClient(url)
    a, b = add_sub_inputs(3)
    ins = [httpclient.InferInput("A", [1, 16], "FP32"), httpclient.InferInput("B", [1, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    r = c.infer(model, ins, outputs=[httpclient.InferRequestedOutput("SUM", class_count=k)])
    c.close()
    return decode(r.as_numpy("SUM")), (a + b)[0]


@pytest.fixture(scope="module")
def node(server_factory, repo):
    return server_factory([repo], name="classify")


def expected(values: np.ndarray, k: int, labels=()) -> list[str]:
    """Triton's strings for one row: highest first, ties by index, 6 decimals for floats."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]
    return [f"{values[i]:.6f}:{i}" + (f":{labels[i]}" if i < len(labels) else "") for i in order]


def add_sub_http(url, k, binary):
    c = httpclient.InferenceServerClient(url)
    a, b = add_sub_inputs(5)
    a = np.vstack([a, a[:, ::-1]])  # two rows with different orders
    b = np.vstack([b, b])
    ins = [httpclient.InferInput("INPUT0", [2, 16], "FP32"), httpclient.InferInput("INPUT1", [2, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    out = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=k),
           httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary)]
    r = c.infer("add_sub", ins, outputs=out)
    c.close()
    return r, a + b, a - b


def decode(arr) -> list[list[str]]:
    return [[x.decode() if isinstance(x, bytes) else x for x in row] for row in arr]


@pytest.mark.parametrize("binary", [True, False])
def test_http_top_classes_with_labels_per_batch_row(node, binary):
    r, sums, diffs = add_sub_http(node.http_url, 3, binary)
    top = r.as_numpy("OUTPUT0")
    assert top.shape == (2, 3) and r.get_output("OUTPUT0")["datatype"] == "BYTES"
    assert decode(top) == [expected(sums[0], 3, LABELS), expected(sums[1], 3, LABELS)]
    # An output asked for without a class count is the plain tensor.
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), diffs)


def test_grpc_and_a_count_above_the_classes_returns_every_class(node):
    c = grpcclient.InferenceServerClient(node.grpc_url)
    a, b = add_sub_inputs(9)
    ins = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    r = c.infer("add_sub", ins, outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=100)])
    top = r.as_numpy("OUTPUT0")
    assert top.shape == (1, 16)
    assert decode(top) == [expected((a + b)[0], 16, LABELS)]
    assert "classification" in c.get_server_metadata().extensions
    c.close()


def test_bad_class_counts_and_bytes_outputs_are_clear_errors(node):
    import json
    import urllib.request
    body = {"inputs": [{"name": n, "shape": [1, 16], "datatype": "FP32", "data": [0.0] * 16}
                       for n in ("INPUT0", "INPUT1")],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": -2}}]}
    req = urllib.request.Request(f"http://{node.http_url}/v2/models/add_sub/infer", data=json.dumps(body).encode(),
                                 method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400 and b"positive integer class count" in e.value.read()
    # The node keeps serving.
    r, sums, _ = add_sub_http(node.http_url, 1, True)
    assert decode(r.as_numpy("OUTPUT0"))[0] == expected(sums[0], 1, LABELS)


def test_the_quick_deploy_densenet_with_no_config(node):
    """The tutorial's model, auto-completed from the ONNX file; its class scores checked against
    ONNX Runtime run directly."""
    import onnxruntime as ort
    cfg = node.get_json("/v2/models/densenet_onnx/config")
    (inp,), (out,) = cfg["input"], cfg["output"]
    shape = [1, 3, 224, 224]
    x = np.random.default_rng(7).random(shape, dtype=np.float32)
    scores = ort.InferenceSession(DENSENET).run(None, {inp["name"]: x})[0].reshape(-1)
    c = httpclient.InferenceServerClient(node.http_url)
    i = httpclient.InferInput(inp["name"], shape, "FP32")
    i.set_data_from_numpy(x)
    r = c.infer("densenet_onnx", [i], outputs=[httpclient.InferRequestedOutput(out["name"], binary_data=True,
                                                                                class_count=5)])
    c.close()
    got = [s.decode().split(":") for s in r.as_numpy(out["name"]).reshape(-1)]
    assert len(got) == 5 and all(len(g) == 2 for g in got), got  # no label file: "value:index"
    values, index = [float(g[0]) for g in got], [int(g[1]) for g in got]
    assert values == sorted(values, reverse=True) and len(set(index)) == 5, got
    # Each class's value is the model's score for that class, and the first is the best score (the
    # light model's scores may tie, so the indices are not compared with ONNX Runtime's order).
    np.testing.assert_allclose(values, scores[index], rtol=1e-4)
    assert values[0] == pytest.approx(scores.max(), rel=1e-4)


@pytest.mark.cluster
def test_through_the_router(cluster_factory, repo):
    c = cluster_factory()
    c.start_router()
    c.start_node("n1", [repo])
    r, sums, _ = add_sub_http(c.router.http_url, 2, True)
    assert decode(r.as_numpy("OUTPUT0")) == [expected(sums[0], 2, LABELS), expected(sums[1], 2, LABELS)]
    cl = httpclient.InferenceServerClient(c.router.http_url)
    assert "classification" in cl.get_server_metadata()["extensions"]
    cl.close()


@pytest.mark.cluster
def test_ensembles_classify_their_outputs_on_a_node_and_on_the_router(node, cluster_factory, repo, tmp_path):
    labels = [f"sum-{i}" for i in range(16)]
    top, sums = ensemble_top(node.http_url, 4)
    assert top == [expected(sums, 4, labels)]
    # The router's own ensemble (its repository), its step on a node: the router classifies.
    own = tmp_path / "router-repo"
    write_ensemble(own)
    c = cluster_factory()
    c.start_router([own])
    models = tmp_path / "node-repo"
    shutil.copytree(repo / "add_sub", models / "add_sub")
    c.start_node("n1", [models])
    client = httpclient.InferenceServerClient(c.router.http_url)
    wait_until(lambda: client.is_model_ready("add_sub_ens"), 30, "the router's ensemble to be ready")
    client.close()
    top, sums = ensemble_top(c.router.http_url, 2)
    assert top == [expected(sums, 2, labels)]


def test_an_ensemble_output_without_labels_takes_its_steps(node):
    """As Triton (L0_infer's test_class_* on its simple ensembles): an ensemble output with no
    label file of its own is labelled with the labels of the step output that makes it."""
    top, sums = ensemble_top(node.http_url, 16, model="add_sub_bare")
    assert top == [expected(sums, 16, LABELS)]
    assert any(len(t.split(":")) == 3 for t in top[0]), top
