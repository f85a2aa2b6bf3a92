"""Triton's response cache (issue 15): `--cache-config local,size=BYTES` on the node and
`response_cache { enable: true }` in a model's config. Identical requests (same model and inputs,
whatever the id, parameters, protocol or outputs asked for) are answered from a bounded cache with
outputs identical to computed ones; hits and misses are in the statistics extension and in the
metrics with Triton's names; the cache evicts the least recently used; a bad flag stops the node."""
import re
import shutil
import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from cluster_util import add_sub_inputs, wait_until

pytestmark = [pytest.mark.server]


@pytest.fixture(scope="module")
def repo(models_dir, tmp_path_factory):
    """add_sub as it is, and add_sub_cached: the same model with the response cache enabled."""
    root = tmp_path_factory.mktemp("cache") / "repo"
    shutil.copytree(models_dir / "simple" / "add_sub", root / "add_sub",
                    ignore=shutil.ignore_patterns("notes", "not_a_version"))
    shutil.copytree(root / "add_sub", root / "add_sub_cached")
    cfg = root / "add_sub_cached" / "config.pbtxt"
    text = cfg.read_text().replace('name: "add_sub"', 'name: "add_sub_cached"')
    cfg.write_text(text + "\nresponse_cache { enable: true }\n")
    return root


@pytest.fixture(scope="module")
def node(server_factory, repo):
    return server_factory([repo], ["--cache-config", "local,size=1048576"], name="cache")


def infer(url, model, i, proto="http", outputs=None, request_id=""):
    mod = httpclient if proto == "http" else grpcclient
    c = mod.InferenceServerClient(url)
    a, b = add_sub_inputs(i)
    ins = [mod.InferInput("INPUT0", [1, 16], "FP32"), mod.InferInput("INPUT1", [1, 16], "FP32")]
    ins[0].set_data_from_numpy(a)
    ins[1].set_data_from_numpy(b)
    outs = [mod.InferRequestedOutput(o) for o in outputs] if outputs else None
    r = c.infer(model, ins, outputs=outs, request_id=request_id)
    c.close()
    return r, a, b


def stats(node, model):
    s = node.get_json(f"/v2/models/{model}/stats")["model_stats"][0]
    st = s["inference_stats"]
    return {"hit": st["cache_hit"]["count"], "miss": st["cache_miss"]["count"], "success": st["success"]["count"],
            "compute": st["compute_infer"]["count"], "inferences": s["inference_count"],
            "executions": s["execution_count"], "last": s["last_inference"]}


def metric(text, name, model=None) -> float | None:
    labels = r'\{model="%s",version="1"\}' % model if model else ""
    m = re.search(rf"^{name}{labels} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_identical_requests_are_answered_from_the_cache(node):
    before = stats(node, "add_sub_cached")
    r1, a, b = infer(node.http_url, "add_sub_cached", 101, request_id="first")
    after_miss = stats(node, "add_sub_cached")
    # The same inputs again: another id, gRPC, only one output asked for; all hits.
    r2, _, _ = infer(node.http_url, "add_sub_cached", 101, request_id="second")
    r3, _, _ = infer(node.grpc_url, "add_sub_cached", 101, proto="grpc", request_id="third")
    r4, _, _ = infer(node.http_url, "add_sub_cached", 101, outputs=["OUTPUT1"])
    for r in (r1, r2, r3):
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    assert r1.as_numpy("OUTPUT0").tobytes() == r2.as_numpy("OUTPUT0").tobytes() == r3.as_numpy("OUTPUT0").tobytes()
    assert r4.as_numpy("OUTPUT0") is None and r4.as_numpy("OUTPUT1").tobytes() == (a - b).tobytes()
    assert r2.get_response()["id"] == "second" and r3.get_response().id == "third", "the new request's id"
    after = stats(node, "add_sub_cached")
    assert after["miss"] - before["miss"] == 1 and after["hit"] - before["hit"] == 3, (before, after)
    # A hit is a success without compute, inference or execution, and leaves last_inference.
    assert after["success"] - before["success"] == 4
    assert (after["compute"], after["inferences"], after["executions"]) == \
        (after_miss["compute"], after_miss["inferences"], after_miss["executions"])
    assert after["last"] == after_miss["last"]
    # Other inputs: a miss, computed.
    r5, a5, b5 = infer(node.http_url, "add_sub_cached", 102)
    np.testing.assert_array_equal(r5.as_numpy("OUTPUT0"), a5 + b5)
    assert stats(node, "add_sub_cached")["miss"] - before["miss"] == 2


def test_models_without_the_cache_compute_every_request(node):
    before = stats(node, "add_sub")
    for _ in range(3):
        infer(node.http_url, "add_sub", 7)
    after = stats(node, "add_sub")
    assert after["inferences"] - before["inferences"] == 3 and after["hit"] == after["miss"] == 0


def test_cache_metrics_have_tritons_names(node):
    infer(node.http_url, "add_sub_cached", 201)
    infer(node.http_url, "add_sub_cached", 201)
    text = node.metrics()
    hits = metric(text, "nv_cache_num_hits_per_model", "add_sub_cached")
    misses = metric(text, "nv_cache_num_misses_per_model", "add_sub_cached")
    st = stats(node, "add_sub_cached")
    assert (hits, misses) == (st["hit"], st["miss"]), text
    assert metric(text, "nv_cache_hit_duration_per_model", "add_sub_cached") is not None
    assert metric(text, "nv_cache_miss_duration_per_model", "add_sub_cached") is not None
    # Per-model families only for models that enable the cache, as Triton exports them.
    assert metric(text, "nv_cache_num_hits_per_model", "add_sub") is None
    assert metric(text, "nv_cache_num_entries") >= 2
    assert metric(text, "nv_cache_num_lookups") == metric(text, "nv_cache_num_hits") + metric(text, "nv_cache_num_misses")
    assert 0 < metric(text, "nv_cache_util") < 1


def test_the_cache_is_bounded_least_recently_used_first(fresh_server, repo):
    # Room for one add_sub response (two [1, 16] FP32 outputs and bookkeeping), not two.
    srv = fresh_server([repo], ["--cache-config", "local,size=700"])
    for i in (1, 2, 1):
        infer(srv.http_url, "add_sub_cached", i)
    st = stats(srv, "add_sub_cached")
    assert (st["miss"], st["hit"]) == (3, 0), "2 evicted 1, then 1 evicted 2"
    infer(srv.http_url, "add_sub_cached", 1)
    assert stats(srv, "add_sub_cached")["hit"] == 1
    text = srv.metrics()
    assert metric(text, "nv_cache_num_entries") == 1 and metric(text, "nv_cache_num_evictions") == 2


def test_without_cache_config_nothing_is_cached(fresh_server, repo):
    srv = fresh_server([repo])
    for _ in range(2):
        infer(srv.http_url, "add_sub_cached", 5)
    st = stats(srv, "add_sub_cached")
    assert st["inferences"] == 2 and st["hit"] == st["miss"] == 0
    assert metric(srv.metrics(), "nv_cache_num_entries") is None


@pytest.mark.parametrize("flags,want", [
    (["--cache-config", "local"], "<cache name>,<setting>=<value>"),
    (["--cache-config", "local,bogus=1"], "one setting is size"),
    (["--cache-config", "local,size=0"], "size must be positive"),
    (["--cache-config", "redis,host=localhost"], "unknown cache 'redis'"),
    # Triton's words, which L0_response_cache looks for.
    (["--cache-config", "local,size=8192", "--cache-config", "redis,key=value"],
     "found multiple cache configurations, but only a single cache is currently supported"),
    (["--response-cache-byte-size", "12345", "--cache-config", "local,size=67890"],
     "Incompatible flags --response-cache-byte-size and --cache-config both provided"),
])
def test_a_bad_cache_config_stops_the_node(mesh_bin, repo, flags, want):
    p = subprocess.run([str(mesh_bin), "--model-repository", str(repo), *flags,
                        "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and want in p.stderr + p.stdout, (p.returncode, p.stderr)


@pytest.mark.parametrize("extra,what", [
    ("model_transaction_policy { decoupled: true }", "'decoupled' transaction policy"),
    ("sequence_batching { }", "sequence batching scheduler"),
])
def test_the_cache_refuses_models_whose_answers_the_inputs_do_not_decide(mesh_bin, repo, tmp_path, extra, what):
    """As Triton (L0_response_cache): a decoupled or sequence model with the cache enabled fails
    to load, with Triton's words (--exit-on-error makes that stop the node)."""
    bad = tmp_path / "bad"
    shutil.copytree(repo / "add_sub_cached", bad / "add_sub_cached")
    cfg = bad / "add_sub_cached" / "config.pbtxt"
    cfg.write_text(cfg.read_text() + extra + "\n")
    p = subprocess.run([str(mesh_bin), "--model-repository", str(bad), "--cache-config", "local,size=10480",
                        "--exit-on-error", "true", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
                       capture_output=True, text=True, timeout=60)
    want = f"Response Cache does not currently support model add_sub_cached with {what}. Please disable the response cache."
    assert p.returncode != 0 and want in p.stderr + p.stdout, (p.returncode, p.stderr[-2000:])


def test_an_answer_larger_than_the_cache_is_logged_and_served(fresh_server, repo):
    srv = fresh_server([repo], ["--cache-config", "local,size=200"])
    r, a, b = infer(srv.http_url, "add_sub_cached", 7)
    np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    wait_until(lambda: "Failed to insert key [" in srv.log_tail(200), 30, "the failed insertion is logged")
    line = next(l for l in srv.log_tail(200).splitlines() if "Failed to insert key [" in l)
    assert "into response cache: Requested byte_size: " in line and "is greater than total cache size: 200" in line


@pytest.mark.cluster
def test_through_the_router(cluster_factory, repo):
    c = cluster_factory()
    c.start_router()
    n = c.start_node("n1", [repo], ["--cache-config", "local,size=1048576"])
    for _ in range(3):
        r, a, b = infer(c.router.http_url, "add_sub_cached", 301)
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
    cl = httpclient.InferenceServerClient(c.router.http_url)
    wait_until(lambda: cl.get_inference_statistics("add_sub_cached")["model_stats"][0]["inference_stats"]
               ["cache_hit"]["count"] == 2, 10, "the router's statistics to show the node's hits")
    cl.close()
    st = stats(n, "add_sub_cached")
    assert (st["hit"], st["miss"]) == (2, 1)
