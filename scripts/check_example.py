"""Checks a server of the bundled example as a user would, with tritonclient: every model of
configs/example-repo (the Python ones included) is READY, and the MLP answers one inference over HTTP
and one over gRPC with the reference's numbers. Used by scripts/check-fresh.sh inside the fresh root.

    python scripts/check_example.py [--url localhost:8000] [--grpc-url localhost:8001] [--wait 120]
"""

import argparse
import pathlib
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gen_models  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "configs" / "example-repo"


def wait_live(client, seconds):
    end = time.monotonic() + seconds
    while True:
        try:
            if client.is_server_ready():
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        if time.monotonic() > end:
            sys.exit(f"check: the server did not become ready within {seconds} s")
        time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="localhost:8000")
    ap.add_argument("--grpc-url", default="localhost:8001")
    ap.add_argument("--wait", type=float, default=120)
    args = ap.parse_args()

    http = httpclient.InferenceServerClient(args.url, network_timeout=120)
    wait_live(http, args.wait)
    want = sorted(p.name for p in EXAMPLE.iterdir() if (p / "config.pbtxt").exists())
    index = {m["name"]: m.get("state") for m in http.get_model_repository_index()}
    missing = [m for m in want if index.get(m) != "READY"]
    if missing:
        sys.exit(f"check: models not READY: {missing} (index: {index})")
    print(f"check: {len(want)} models READY: {', '.join(want)}")

    x = np.random.default_rng(1).standard_normal((4, gen_models.MLP_IN)).astype(np.float32)
    ref = gen_models.mlp_reference(x, gen_models.mlp_weights())
    inp = httpclient.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    np.testing.assert_allclose(http.infer("mlp", [inp]).as_numpy("y"), ref, rtol=1e-4, atol=1e-5)
    grpc = grpcclient.InferenceServerClient(args.grpc_url)
    ginp = grpcclient.InferInput("x", list(x.shape), "FP32")
    ginp.set_data_from_numpy(x)
    np.testing.assert_allclose(grpc.infer("mlp", [ginp]).as_numpy("y"), ref, rtol=1e-4, atol=1e-5)
    print("check: mlp answers over HTTP and gRPC with the reference's numbers")
    http.close()
    grpc.close()


if __name__ == "__main__":
    main()
