"""The statistics extension through tritonclient (HTTP and gRPC), on a private server so counts are exact."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

pytestmark = [pytest.mark.server]


def _infer(client, mod, batch):
    a = np.ones((batch, 16), np.float32)
    ins = [mod.InferInput("INPUT0", list(a.shape), "FP32"), mod.InferInput("INPUT1", list(a.shape), "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(a)
    return client.infer("add_sub", ins)


def _bad(client, mod):
    a = np.ones((1, 3), np.float32)
    i = mod.InferInput("INPUT0", [1, 3], "FP32")
    i.set_data_from_numpy(a)
    with pytest.raises(Exception):
        client.infer("add_sub", [i])


def test_statistics_count_requests_batches_and_failures(fresh_server, add_sub_repo):
    srv = fresh_server([add_sub_repo])
    http = httpclient.InferenceServerClient(srv.http_url)
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        for b in (1, 1, 4):
            _infer(http, httpclient, b)
        _infer(grpc, grpcclient, 2)
        _bad(http, httpclient)

        s = http.get_inference_statistics("add_sub")["model_stats"]
        assert len(s) == 1 and s[0]["name"] == "add_sub" and s[0]["version"] == "1"
        st = s[0]
        assert st["inference_count"] == 8
        assert st["execution_count"] == 4
        assert st["inference_stats"]["success"]["count"] == 4
        assert st["inference_stats"]["fail"]["count"] == 1
        assert st["inference_stats"]["compute_infer"]["count"] == 4
        assert st["inference_stats"]["compute_infer"]["ns"] > 0
        assert st["last_inference"] > 0
        sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in st["batch_stats"]}
        assert sizes == {1: 2, 2: 1, 4: 1}

        g = grpc.get_inference_statistics("add_sub", "1", as_json=True)["model_stats"][0]
        assert int(g["inference_count"]) == 8 and int(g["execution_count"]) == 4

        all_models = http.get_inference_statistics()["model_stats"]
        assert [m["name"] for m in all_models] == ["add_sub"]
    finally:
        http.close()
        grpc.close()


def test_statistics_of_unknown_model_is_not_found(fresh_server, add_sub_repo):
    srv = fresh_server([add_sub_repo])
    r = srv.get("/v2/models/nope/stats")
    assert r.status == 404 and "nope" in r.error_message()
    r = srv.get("/v2/models/add_sub/versions/7/stats")
    assert r.status == 404
    assert "statistics" in srv.get_json("/v2")["extensions"]
