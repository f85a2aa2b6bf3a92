"""The OCR pipeline of the example repository (PP-OCRv4): rendered text read back via BLS and the ensemble."""
import glob
import importlib.util
import io
import re
import sys
import types

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

import ocr_models
from conftest import REPO_ROOT

pytest.importorskip("PIL", reason="Pillow renders the test images")
from PIL import Image, ImageDraw, ImageFont  # noqa: E402

LATIN_FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
CJK_FONT_NAMES = re.compile(r"(cjk|wqy|droidsansfallback|notosanssc|simhei|simsun|uming|ukai)", re.I)
EXAMPLE = REPO_ROOT / "configs" / "example-repo"
OCR_CONFIGS = ["ocr", "ocr_pre", "ocr_post", "ocr_decode", "ocr_bls", "ocr_rec"]

# Black text on white, one string per line. At these sizes PP-OCRv4 reads every character and space.
PAGES = [
    (["Hello World"], 40),
    (["The quick brown fox", "jumps over 13 lazy dogs"], 32),
    (["mesh-node serves ONNX models"], 48),
]
PAGE_IDS = ["one-line", "two-lines", "long-line"]
GARBAGE = [b"this is not an image", b"\x89PNG\r\n\x1a\n" + b"\x00" * 64]
CLIENT_ERROR = ("400", "StatusCode.INVALID_ARGUMENT")


def cjk_font():
    for path in sorted(glob.glob("/usr/share/fonts/**/*.tt[fc]", recursive=True)):
        if CJK_FONT_NAMES.search(path):
            return path
    return None


def render(lines, size, font_path=LATIN_FONT, fmt="PNG") -> bytes:
    if not (font_path and glob.glob(font_path)):
        pytest.skip(f"font {font_path} is not installed")
    font = ImageFont.truetype(font_path, size)
    pad, step = 24, int(size * 1.8)
    width = max(int(font.getlength(line)) for line in lines) + 2 * pad
    img = Image.new("RGB", (width, len(lines) * step + 2 * pad), "white")
    draw = ImageDraw.Draw(img)
    for i, line in enumerate(lines):
        draw.text((pad, pad + i * step), line, fill="black", font=font)
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


def normalized(texts):
    return [" ".join(t.split()) for t in texts]


def read(url, protocol, model, data: bytes) -> list:
    """One inference: the file's bytes as a UINT8 [len] tensor -> the decoded strings."""
    mod = httpclient if protocol == "http" else grpcclient
    client = (mod.InferenceServerClient(url, network_timeout=120) if protocol == "http"
              else mod.InferenceServerClient(url))
    try:
        image = np.frombuffer(data, np.uint8)
        inp = mod.InferInput("image", [image.size], "UINT8")
        inp.set_data_from_numpy(image)
        text = client.infer(model, [inp]).as_numpy("text")
    finally:
        client.close()
    assert text.dtype == np.object_ and text.ndim == 1
    return [t.decode("utf-8") for t in text]


def url_for(server, protocol):
    return server.http_url if protocol == "http" else server.grpc_url


def load_config(name) -> mc.ModelConfig:
    return text_format.Parse((EXAMPLE / name / "config.pbtxt").read_text(), mc.ModelConfig())


def full_dims(cfg, tensor):
    return ([-1] if cfg.max_batch_size > 0 else []) + list(tensor.dims)


# --------------------------------------------------------------------------
# Offline: the generated and committed files agree

@pytest.mark.offline
def test_committed_ocr_configs_parse_and_rec_config_matches_generator():
    assert (EXAMPLE / "ocr_rec" / "config.pbtxt").read_text() == ocr_models.ocr_rec_config()
    for name in OCR_CONFIGS:
        assert load_config(name).name == name
    assert [s.model_name for s in load_config("ocr").ensemble_scheduling.step] == [
        "ocr_pre", "ocr_det", "ocr_post", "ocr_rec", "ocr_decode"]


@pytest.mark.offline
def test_ensemble_wiring_matches_the_step_models():
    """Every input_map key is an input of its step, every output_map key an output, every tensor is
    produced before it is consumed, with one data type and compatible shapes."""
    ens = load_config("ocr")
    known = {t.name: (t.data_type, full_dims(ens, t)) for t in ens.input}
    for step in ens.ensemble_scheduling.step:
        cfg = load_config(step.model_name)
        inputs, outputs = {t.name: t for t in cfg.input}, {t.name: t for t in cfg.output}
        assert set(step.input_map) == set(inputs), step.model_name
        for name, tensor in step.input_map.items():
            dtype, dims = known[tensor]
            want = full_dims(cfg, inputs[name])
            assert dtype == inputs[name].data_type and len(dims) == len(want), (step.model_name, name)
            assert all(a == b or -1 in (a, b) for a, b in zip(dims, want)), (step.model_name, name, dims, want)
        assert set(step.output_map) <= set(outputs), step.model_name
        for name, tensor in step.output_map.items():
            assert tensor not in known, f"{tensor} is produced twice"
            known[tensor] = (outputs[name].data_type, full_dims(cfg, outputs[name]))
    for out in ens.output:
        assert known[out.name] == (out.data_type, full_dims(ens, out))


@pytest.mark.offline
def test_bls_model_runs_the_ensembles_steps(monkeypatch):
    """ocr_bls's STEPS table is the ensemble's step list, maps included."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("pb_utils"))
    spec = importlib.util.spec_from_file_location("ocr_bls_model", EXAMPLE / "ocr_bls" / "1" / "model.py")
    bls = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bls)
    steps = [(s.model_name, dict(s.input_map), dict(s.output_map))
             for s in load_config("ocr").ensemble_scheduling.step]
    assert bls.STEPS == steps


@pytest.mark.offline
def test_character_list_fits_the_recognizer(example_dir):
    lines = (example_dir / ocr_models.KEYS_REL).read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "", "one character per line, newline-terminated"
    chars = lines[:-1]
    assert len(chars) + 1 == ocr_models.OCR_REC_CLASSES, "characters + the CTC blank = classes"
    assert chars[-1] == " " and {"A", "z", "0", "中"} <= set(chars)


# --------------------------------------------------------------------------
# Served

@pytest.mark.server
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("lines,size", PAGES, ids=PAGE_IDS)
def test_ocr_bls_reads_the_text(example_server, protocol, lines, size):
    got = read(url_for(example_server, protocol), protocol, "ocr_bls", render(lines, size))
    assert normalized(got) == lines


@pytest.mark.server
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ocr_ensemble_reads_the_text(example_server, protocol):
    c = httpclient.InferenceServerClient(example_server.http_url)
    try:
        row = next((r for r in c.get_model_repository_index() if r["name"] == "ocr"), {})
        assert c.is_model_ready("ocr"), f"ensemble `ocr` is not ready: {row}"
    finally:
        c.close()
    url = url_for(example_server, protocol)
    for lines, size in PAGES:
        assert normalized(read(url, protocol, "ocr", render(lines, size))) == lines
    with pytest.raises(InferenceServerException) as e:
        read(url, protocol, "ocr", GARBAGE[0])
    assert "not a decodable image" in str(e.value) and e.value.status() in CLIENT_ERROR, e.value


@pytest.mark.server
def test_ocr_reads_jpeg_and_blank_pages(example_server):
    url = example_server.http_url
    assert normalized(read(url, "http", "ocr_bls", render(["Hello World"], 40, fmt="JPEG"))) == ["Hello World"]
    blank = io.BytesIO()
    Image.new("RGB", (320, 96), "white").save(blank, "PNG")
    assert read(url, "http", "ocr_bls", blank.getvalue()) == [""], "no text regions: one empty string"


@pytest.mark.server
def test_ocr_reads_mixed_latin_and_chinese(example_server):
    font = cjk_font()
    if font is None:
        pytest.skip("no CJK font installed")
    lines = ["OCR 识别 2024", "中文 and English"]
    got = read(example_server.http_url, "http", "ocr_bls", render(lines, 40, font))
    # Spaces between scripts are not reliable in PP-OCRv4's output: compare the characters.
    assert ["".join(t.split()) for t in got] == ["".join(t.split()) for t in lines]


@pytest.mark.server
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("garbage", GARBAGE, ids=["text", "truncated-png"])
def test_garbage_input_is_a_clear_error_and_serving_goes_on(example_server, protocol, garbage):
    url = url_for(example_server, protocol)
    with pytest.raises(InferenceServerException) as e:
        read(url, protocol, "ocr_pre", garbage)
    assert "not a decodable image" in str(e.value) and e.value.status() in CLIENT_ERROR, e.value
    with pytest.raises(InferenceServerException) as e:
        read(url, protocol, "ocr_bls", garbage)
    # The step's name, message and code (INVALID_ARG) come through BLS.
    message = str(e.value)
    assert "ocr_pre" in message and "not a decodable image" in message, message
    assert e.value.status() in CLIENT_ERROR, e.value
    assert normalized(read(url, protocol, "ocr_bls", render(["Hello World"], 40))) == ["Hello World"]
