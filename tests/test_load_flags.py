"""tritonserver's flags about loading models and sampling metrics, on mesh-node (issue 27):
`--model-config-name`, `--disable-auto-complete-config` / `--strict-model-config`,
`--model-load-retry-count`, `--model-load-thread-count`, `--model-load-gpu-limit`, `--allow-cpu-metrics`,
`--allow-gpu-metrics` and `--metrics-interval-ms`."""
import shutil
import sys

import pytest
import tritonclient.http as httpclient

pytestmark = [pytest.mark.server]

PYTHON = ["--backend-config", f"python,interpreter={sys.executable}"]


def index_entry(srv, model):
    entries = [e for e in srv.index() if e.get("name") == model]
    assert entries, srv.index()
    return entries[0]


def test_model_config_name_reads_configs_name_pbtxt_where_it_exists(fresh_server, add_sub_repo):
    custom = add_sub_repo / "add_sub" / "configs"
    custom.mkdir()
    text = (add_sub_repo / "add_sub" / "config.pbtxt").read_text()
    (custom / "h100.pbtxt").write_text(text + '\nparameters { key: "chosen" value { string_value: "h100" } }\n')
    srv = fresh_server([add_sub_repo], ["--model-config-name", "h100"])
    cfg = httpclient.InferenceServerClient(srv.http_url).get_model_config("add_sub")
    assert cfg["parameters"]["chosen"]["string_value"] == "h100"
    # A name without such a file falls back to config.pbtxt, as in Triton.
    srv2 = fresh_server([add_sub_repo], ["--model-config-name", "a100"])
    cfg = httpclient.InferenceServerClient(srv2.http_url).get_model_config("add_sub")
    assert "chosen" not in cfg.get("parameters", {})


def test_a_config_name_that_is_a_path_stops_the_start(fresh_server, add_sub_repo):
    with pytest.raises(Exception) as e:
        fresh_server([add_sub_repo], ["--model-config-name", "../../etc/x"])
    assert "must be a plain name" in str(e.value)


def test_model_load_gpu_limit_is_read_at_start_and_leaves_cpu_models_alone(fresh_server, add_sub_repo):
    with pytest.raises(Exception) as e:
        fresh_server([add_sub_repo], ["--model-load-gpu-limit", "0:lots"])
    assert "must be <device_id>:<fraction>" in str(e.value)
    # The limit is checked for the GPUs a model's instances use; a CPU model loads under any.
    srv = fresh_server([add_sub_repo], ["--model-load-gpu-limit", "0:0.0"])
    assert httpclient.InferenceServerClient(srv.http_url).is_model_ready("add_sub")


@pytest.mark.parametrize("flag", [["--disable-auto-complete-config"], ["--strict-model-config", "true"]])
def test_without_auto_complete_a_config_must_be_complete(fresh_server, models_dir, tmp_path, flag):
    repo = tmp_path / "repo"
    repo.mkdir()
    # add_sub without its config: auto-complete would fill it from the ONNX file.
    shutil.copytree(models_dir / "simple" / "add_sub" / "1", repo / "bare" / "1")
    shutil.copytree(models_dir / "simple" / "add_sub", repo / "add_sub")
    srv = fresh_server([repo], flag + ["--exit-on-error", "false", "--strict-readiness", "false"],
                       wait_models=["add_sub"])
    entry = index_entry(srv, "bare")
    assert entry["state"] == "UNAVAILABLE" and "does not list" in entry["reason"], entry
    completed = fresh_server([repo], wait_models=["add_sub", "bare"])
    assert httpclient.InferenceServerClient(completed.http_url).is_model_ready("bare")


FAILS_ONCE = '''
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        marker = os.path.join(args["model_repository"], "failed_once")
        if not os.path.exists(marker):
            open(marker, "w").close()
            raise pb_utils.TritonModelException("first load fails on purpose")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
'''


def flaky_repo(tmp_path):
    d = tmp_path / "repo" / "flaky"
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(FAILS_ONCE)
    (d / "config.pbtxt").write_text('backend: "python"\n'
                                    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    return tmp_path / "repo"


def test_load_retry_count_tries_a_failed_load_again(fresh_server, tmp_path):
    srv = fresh_server([flaky_repo(tmp_path)], PYTHON + ["--model-load-retry-count", "1"])
    assert httpclient.InferenceServerClient(srv.http_url).is_model_ready("flaky")
    assert "load failed, trying again" in srv.log_tail(200)


def test_without_retries_the_first_failure_stands(fresh_server, tmp_path):
    srv = fresh_server([flaky_repo(tmp_path)], PYTHON + ["--exit-on-error", "false", "--strict-readiness", "false"],
                       wait_models=[])
    entry = index_entry(srv, "flaky")
    assert entry["state"] == "UNAVAILABLE" and "first load fails on purpose" in entry["reason"], entry


SLOW_INIT = '''
import os
import time

import triton_python_backend_utils as pb_utils

WANT = @WANT@


class TritonPythonModel:
    def initialize(self, args):
        # Leaves its marker in running/ while it runs and one in started/ for good, waits (up to 30 s)
        # until WANT initialize() calls have started, then watches running/ for a second more: it
        # records the most calls it saw in initialize() at once. With WANT loads at once the barrier
        # is met as soon as they are all in; with loads one at a time (WANT 1) no other may appear.
        shared = os.path.join(args["model_repository"], "..", "..")
        running, started = os.path.join(shared, "running"), os.path.join(shared, "started")
        name = args["model_name"]
        open(os.path.join(started, name), "w").close()
        open(os.path.join(running, name), "w").close()
        most = 0
        deadline = time.monotonic() + 30
        while len(os.listdir(started)) < WANT and time.monotonic() < deadline:
            most = max(most, len(os.listdir(running)))
            time.sleep(0.01)
        watch = time.monotonic() + 1.0
        while time.monotonic() < watch:
            most = max(most, len(os.listdir(running)))
            time.sleep(0.01)
        os.remove(os.path.join(running, name))
        with open(os.path.join(shared, "seen.txt"), "a") as f:
            f.write(f"{name} {most}\\n")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
'''


def slow_repo(tmp_path, n, want):
    repo = tmp_path / "repo"
    for d in ("running", "started"):
        (tmp_path / d).mkdir()
    for i in range(n):
        d = repo / f"slow{i}"
        (d / "1").mkdir(parents=True)
        (d / "1" / "model.py").write_text(SLOW_INIT.replace("@WANT@", str(want)))
        (d / "config.pbtxt").write_text('backend: "python"\n'
                                        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    return repo


@pytest.mark.parametrize("threads", [3, 1])
def test_load_thread_count_loads_that_many_models_at_once(fresh_server, tmp_path, threads):
    """Three Python models: each initialize() waits at a barrier until min(3, threads) of them have
    started, then watches a second more. With three load threads all three run at once (were fewer
    loaded at once, the barrier would time out after 30 s with fewer than 3 seen); with one, never two do."""
    repo = slow_repo(tmp_path, 3, want=min(3, threads))
    fresh_server([repo], PYTHON + ["--model-load-thread-count", str(threads)],
                 wait_models=["slow0", "slow1", "slow2"])
    seen = dict(line.split() for line in (tmp_path / "seen.txt").read_text().splitlines())
    assert sorted(seen) == ["slow0", "slow1", "slow2"], seen
    assert max(int(v) for v in seen.values()) == threads, f"initialize() calls seen at once: {seen}"


def test_a_load_thread_count_of_zero_stops_the_start(fresh_server, add_sub_repo):
    with pytest.raises(Exception) as e:
        fresh_server([add_sub_repo], ["--model-load-thread-count", "0"])
    assert "--model-load-thread-count must be at least 1" in str(e.value)


def test_cpu_metrics_follow_allow_cpu_metrics_and_the_interval(fresh_server, add_sub_repo):
    import time

    srv = fresh_server([add_sub_repo], ["--metrics-interval-ms", "100"])
    deadline = time.monotonic() + 10
    while "nv_cpu_utilization" not in srv.metrics() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = srv.metrics()
    assert "nv_cpu_utilization" in text and "nv_cpu_memory_total_bytes" in text
    off = fresh_server([add_sub_repo], ["--allow-cpu-metrics", "false", "--metrics-interval-ms", "100"])
    time.sleep(0.5)
    assert "nv_cpu_" not in off.metrics()


def test_gpu_metrics_on_a_node_without_gpus_are_absent_and_nothing_fails(fresh_server, add_sub_repo):
    """--allow-gpu-metrics true (the default) on a CPU-only node: no nv_gpu_* family, no NVML
    warning (the node said it runs CPU-only), and the CPU metrics as usual. On a node with GPUs
    the same flag samples NVML (telemetry/gpu.rs, unit-tested for Triton's units)."""
    import time

    srv = fresh_server([add_sub_repo], ["--allow-gpu-metrics", "true", "--metrics-interval-ms", "100"])
    if "running CPU-only" not in srv.log_tail(400):
        pytest.skip("this machine has a GPU")
    deadline = time.monotonic() + 10
    while "nv_cpu_utilization" not in srv.metrics() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = srv.metrics()
    assert "nv_cpu_utilization" in text and "nv_gpu_" not in text and "nv_energy" not in text
    assert "GPU metrics" not in srv.log_tail(400)


def test_a_metrics_interval_out_of_range_stops_the_start(fresh_server, add_sub_repo):
    with pytest.raises(Exception) as e:
        fresh_server([add_sub_repo], ["--metrics-interval-ms", "0"])
    assert "--metrics-interval-ms" in str(e.value)


def test_metrics_config_gives_summaries_and_drops_counters(fresh_server, add_sub_repo):
    srv = fresh_server([add_sub_repo], ["--metrics-config", "summary_latencies=true",
                                        "--metrics-config=counter_latencies=false",
                                        "--metrics-config", "summary_quantiles=0.5:0.05,0.9:0.01"])
    client = httpclient.InferenceServerClient(srv.http_url)
    import numpy as np
    ins = [httpclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in ins:
        i.set_data_from_numpy(np.ones((1, 16), np.float32))
    for _ in range(3):
        client.infer("add_sub", ins)
    text = srv.metrics()
    assert 'nv_inference_request_summary_us_count{model="add_sub",version="1"} 3' in text, text
    assert 'nv_inference_compute_infer_summary_us{model="add_sub",version="1",quantile="0.9"}' in text, text
    assert "# TYPE nv_inference_queue_summary_us summary" in text
    assert "nv_inference_request_duration_us" not in text, "counter_latencies=false drops the counters"
    assert 'nv_inference_request_success{model="add_sub",version="1"} 3' in text


def test_an_unknown_metrics_setting_stops_the_start(fresh_server, add_sub_repo):
    with pytest.raises(Exception) as e:
        fresh_server([add_sub_repo], ["--metrics-config", "histograms=true"])
    assert "unknown setting 'histograms'" in str(e.value)
