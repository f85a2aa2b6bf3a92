"""pb_utils checks its arguments as Triton's stub does (issue 44, L0_backend_python's
argument_validation): each case below must raise what Triton raises, or nothing. execute() answers
OK=1 when every case holds, else fails with the cases that did not."""
import numpy as np
import triton_python_backend_utils as pb_utils

ONE = np.array([7], np.int32)


def raises(kind, call):
    """None when `call()` raises `kind`; else what it did instead."""
    try:
        call()
    except kind:
        return None
    except Exception as e:  # noqa: BLE001
        return f"raised {type(e).__name__}: {e}"
    return "raised nothing"


def cases():
    tensor = pb_utils.Tensor("IN", ONE)
    Request, Response, Tensor, Logger = (pb_utils.InferenceRequest, pb_utils.InferenceResponse,
                                         pb_utils.Tensor, pb_utils.Logger)
    req = dict(model_name="m", inputs=[tensor], requested_output_names=["OUT"])
    TE, ME = TypeError, pb_utils.TritonModelException
    yield "inputs=[None]", ME, lambda: Request(**{**req, "inputs": [None]})
    yield "inputs=None", TE, lambda: Request(**{**req, "inputs": None})
    yield "model_name=None", TE, lambda: Request(**{**req, "model_name": None})
    yield "requested_output_names=[None]", TE, lambda: Request(**{**req, "requested_output_names": [None]})
    yield "requested_output_names=None", TE, lambda: Request(**{**req, "requested_output_names": None})
    for arg in ("correlation_id", "request_id", "model_version", "flags"):
        yield f"{arg}=None", TE, lambda arg=arg: Request(**req, **{arg: None})
    yield "Response(output_tensors=[None])", ME, lambda: Response(output_tensors=[None])
    yield "Response(output_tensors=None)", TE, lambda: Response(output_tensors=None)
    yield "Tensor(None, array)", TE, lambda: Tensor(None, ONE)
    yield "Tensor(name, None)", TE, lambda: Tensor("OUT", None)
    yield "Tensor('', array)", ME, lambda: Tensor("", ONE)
    yield "from_dlpack(name, None)", ME, lambda: Tensor.from_dlpack("OUT", None)
    yield "from_dlpack('', None)", ME, lambda: Tensor.from_dlpack("", None)
    yield "from_dlpack of a strided array", ME, lambda: Tensor.from_dlpack("OUT", np.ones((4, 4), np.float32)[:, ::2])
    yield "to_dlpack of BYTES", ME, lambda: Tensor("S", np.array([b"a"], np.object_)).to_dlpack()
    yield "Logger.log(msg, None)", TE, lambda: Logger.log("x", None)
    yield "Logger.log(msg, 1)", TE, lambda: Logger.log("x", 1)
    for name in ("log_info", "log_warn", "log_error", "log_verbose"):
        yield f"Logger.{name}(None)", TE, lambda name=name: getattr(Logger, name)(None)


def accepted():
    """What must work: each returns a value the checks compare."""
    tensor = pb_utils.Tensor("IN", ONE)
    req = dict(model_name="m", inputs=[tensor], requested_output_names=["OUT"])
    yield "correlation_id=5", pb_utils.InferenceRequest(**req, correlation_id=5).correlation_id(), 5
    yield "correlation_id='id-5'", pb_utils.InferenceRequest(**req, correlation_id="id-5").correlation_id(), "id-5"
    yield "correlation_id default", pb_utils.InferenceRequest(**req).correlation_id(), 0
    yield "empty lists", len(pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[]).inputs()), 0
    yield "Response([])", len(pb_utils.InferenceResponse(output_tensors=[]).output_tensors()), 0
    yield "Response(outputs)", len(pb_utils.InferenceResponse([tensor]).output_tensors()), 1
    yield "Response(error=...)", pb_utils.InferenceResponse(error=pb_utils.TritonError("e")).has_error(), True
    yield "bytes model_name", pb_utils.InferenceRequest(**{**req, "model_name": b"m"}).model_name, "m"
    yield "from_dlpack of an array", pb_utils.Tensor.from_dlpack("OUT", ONE).as_numpy().tolist(), [7]
    pb_utils.Logger.log("level unspecified")
    pb_utils.Logger.log("warning", pb_utils.LogLevel.WARNING)
    yield "Logger.log", True, True


def failures():
    out = [f"{name}: {why}" for name, kind, call in cases() if (why := raises(kind, call)) is not None]
    out += [f"{name}: got {got!r}, not {want!r}" for name, got, want in accepted() if got != want]
    return out


class TritonPythonModel:
    def execute(self, requests):
        failed = failures()
        if failed:
            raise pb_utils.TritonModelException("; ".join(failed))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OK", np.array([1], np.int32))]) for _ in requests]
