"""JSON bodies are read within bounds (issue 24, item 3): a 64 MB JSON array of zeros, as an infer
parameter, as an input's data beyond its shape, or as a generate field, is refused with 400 naming
the problem, and the node's peak memory grows by far less than the tree such a body would make
(about 1 GiB); the node serves on.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient

from cluster_util import copy_models
from mesh_util import http_request

pytestmark = [pytest.mark.server]

ZEROS = 33_000_000  # "0," each: a 66 MB array, under the 64 MiB body limit


def status_kib(pid: int, field: str) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def zeros() -> bytes:
    return b"[" + b"0," * (ZEROS - 1) + b"0]"


def test_huge_json_arrays_are_refused_within_bounds(fresh_server, models_dir, tmp_path):
    repo = copy_models(models_dir / "simple", tmp_path / "repo", ["add_sub"])
    srv = fresh_server([repo])
    pid = srv.proc.pid
    before = status_kib(pid, "VmRSS")
    arr = zeros()
    inp = '{"name":"INPUT0","shape":[1,16],"datatype":"FP32","data":%s}'
    ok = json.dumps(list(range(16)))
    cases = [
        (b'{"parameters":{"junk":' + arr + b'},"inputs":[' + (inp % ok).encode() + b"," +
         (inp % ok).replace("INPUT0", "INPUT1").encode() + b"]}",
         "/v2/models/add_sub/infer", "parameter 'junk' to be a bool, number or string"),
        (b'{"inputs":[' + (inp % "X").encode().replace(b"X", arr) + b"]}",
         "/v2/models/add_sub/infer", "more values than the input's shape holds"),
        (b'{"INPUT0":' + arr + b"}", "/v2/models/add_sub/generate", "more than 1048576 JSON values"),
    ]
    for body, path, words in cases:
        assert len(body) < 64 << 20
        r = http_request(srv.http_port, "POST", path, body=body, timeout=120)
        assert r.status == 400, (path, r.status, r.body[:300])
        assert words in json.loads(r.body)["error"], r.body[:300]
    peak = status_kib(pid, "VmHWM")
    grown = (peak - before) / 1024
    print(f"node peak memory grew {grown:.0f} MiB over {len(cases)} bodies of {len(arr) >> 20} MiB")
    assert grown < 256, f"peak memory grew {grown:.0f} MiB"

    c = httpclient.InferenceServerClient(srv.http_url)
    a = np.ones((1, 16), np.float32)
    ins = [httpclient.InferInput("INPUT0", [1, 16], "FP32"), httpclient.InferInput("INPUT1", [1, 16], "FP32")]
    for i in ins:
        i.set_data_from_numpy(a)
    assert np.array_equal(c.infer("add_sub", ins).as_numpy("OUTPUT0"), a + a)
    c.close()
