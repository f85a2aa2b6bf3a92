"""Calls another model from initialize(), which Triton's stub refuses (its qa's bls_init_error):
the load fails with "BLS is only supported during the 'execute' function."."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        x = pb_utils.Tensor("INPUT0", np.ones(4, np.float32))
        pb_utils.InferenceRequest(model_name="add_sub_py", inputs=[x, pb_utils.Tensor("INPUT1", x.as_numpy())],
                                  requested_output_names=["OUTPUT0"]).exec()

    def execute(self, requests):
        raise AssertionError("never loaded")
