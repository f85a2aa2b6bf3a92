"""One reader per request parameter (issue 25, item 3): `sequence_id`, its flags, `timeout` and
`priority` follow the same rule on a node and through a router, over HTTP and gRPC: a negative
`sequence_id`, a non-boolean flag, a timeout or priority that is not a non-negative integer gets the
same 400 / INVALID_ARGUMENT with the same message everywhere, and good values are served."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cluster_util import add_sub_inputs, copy_models

pytestmark = [pytest.mark.server, pytest.mark.cluster]

# As tritonclient sends them (its sequence_id, timeout and priority arguments).
BAD = [
    ({"sequence_id": -3}, "parameter 'sequence_id' must be a positive integer or a string"),
    ({"timeout": -1}, "parameter 'timeout' must be a non-negative integer"),
    ({"priority": 1 << 40}, "parameter 'priority' must be a small non-negative integer"),
]
GOOD = [{}, {"sequence_id": 0}, {"sequence_id": 7}, {"sequence_id": "s-1"}, {"sequence_id": 8, "sequence_start": True},
        {"timeout": 0}, {"timeout": 5_000_000}, {"priority": 1}]


@pytest.fixture(scope="module")
def endpoints(module_cluster_factory, models_dir, tmp_path_factory):
    repo = copy_models(models_dir / "simple", tmp_path_factory.mktemp("params") / "repo", ["add_sub"])
    c = module_cluster_factory("cl-params")
    router = c.start_router()
    node = c.start_node("p1", [repo])
    return {"node": node, "router": router}


def call(where, protocol: str, params: dict):
    a, b = add_sub_inputs(3)
    lib = httpclient if protocol == "http" else grpcclient
    url = where.http_url if protocol == "http" else where.grpc_url
    client = lib.InferenceServerClient(url)
    try:
        ins = [lib.InferInput("INPUT0", [1, 16], "FP32"), lib.InferInput("INPUT1", [1, 16], "FP32")]
        ins[0].set_data_from_numpy(a)
        ins[1].set_data_from_numpy(b)
        r = client.infer("add_sub", ins, **params)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("where", ["node", "router"])
def test_every_parameter_has_one_rule_on_nodes_and_routers(endpoints, where, protocol):
    for params, words in BAD:
        with pytest.raises(InferenceServerException) as e:
            call(endpoints[where], protocol, params)
        assert words in str(e.value), f"{where} over {protocol} with {params}: {e.value}"
        status = str(e.value.status())
        assert status in ("400", "StatusCode.INVALID_ARGUMENT"), f"{where}/{protocol} {params}: {status}"
    for params in GOOD:
        call(endpoints[where], protocol, params)
