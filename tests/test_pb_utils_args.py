"""pb_utils checks its arguments as Triton's stub does (issue 44; L0_backend_python's
argument_validation): TypeError for a wrong type or None, TritonModelException with Triton's words
for None tensors and empty names, LogLevel an enum. The cases live in the arg_checks_py model,
run here twice: in this process against the module (each failing case named), and in a real stub
behind a real node, through tritonclient, as Triton's qa runs them."""
import importlib.util
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

PY_MODELS = Path(__file__).parent / "python_models"


@pytest.fixture
def checks(pb_utils_here):
    """The arg_checks_py model imported here (against pb_utils_here), and the log lines kept."""
    _, lines = pb_utils_here
    spec = importlib.util.spec_from_file_location("arg_checks", PY_MODELS / "arg_checks_py" / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, lines


def test_every_argument_case_matches_triton(checks):
    module, lines = checks
    assert module.failures() == []
    # Only the accepted calls logged, at their levels; the refused ones wrote nothing.
    assert lines == [("info", "level unspecified"), ("warn", "warning")]


def test_the_messages_are_tritons(checks):
    module, _ = checks
    pb = sys.modules["triton_python_backend_utils"]
    with pytest.raises(pb.TritonModelException, match=r"^Input tensor for request with id 'r1' and model "
                                                      r"name 'm' should not be empty\.$"):
        pb.InferenceRequest(model_name="m", request_id="r1", inputs=[None], requested_output_names=[])
    with pytest.raises(pb.TritonModelException, match=r"^Output tensor for inference response should not be empty\.$"):
        pb.InferenceResponse([None])
    with pytest.raises(pb.TritonModelException, match=r"^Tensor name cannot be an empty string\.$"):
        pb.Tensor.from_dlpack("", np.ones(2, np.float32))
    with pytest.raises(pb.TritonModelException, match=r"^Provided tensor is not supported"):
        pb.Tensor.from_dlpack("OUT", [1, 2])
    with pytest.raises(TypeError, match="model_name must be a str, not NoneType"):
        pb.InferenceRequest(model_name=None, inputs=[], requested_output_names=[])


@pytest.mark.server
def test_the_checks_pass_inside_a_real_stub(server_factory, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(PY_MODELS / "arg_checks_py", repo / "arg_checks_py")
    server = server_factory([repo], ["--backend-config", f"python,interpreter={sys.executable}"],
                            name="arg-checks", wait_models=["arg_checks_py"])
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.infer("arg_checks_py", []).as_numpy("OK").tolist() == [1]
