"""Checks of scripts/gen_models.py that need no server: the generated
configs are valid Triton ModelConfig text (or invalid exactly where meant to
be), agree with the ONNX files, and generation is idempotent."""

import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

import gen_models
from conftest import REPO_ROOT

pytestmark = [pytest.mark.offline]

ONNX_TO_CONFIG = {onnx_t: cfg_t for _, onnx_t, cfg_t, _ in gen_models.DTYPES}
INVALID_TEXT = {"bad_field", "bad_dtype"}


def configs(models_dir):
    return sorted(models_dir.glob("*/*/config.pbtxt"))


def parse(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def test_expected_models_exist(models_dir):
    names = {p.name for p in (models_dir / "dtypes").iterdir()}
    assert names == {gen_models.identity_model_name(d) for d in gen_models.DTYPE_NAMES} | {"identity_fp32_nobatch"}
    simple = {p.name for p in (models_dir / "simple").iterdir() if p.is_dir()}
    assert simple == {"add_sub", "mlp", "auto_batched", "auto_fixed", "partial_cfg", "custom_filename",
                      *gen_models.VERSIONED}
    assert not (models_dir / "simple" / "auto_batched" / "config.pbtxt").exists()
    assert not (models_dir / "simple" / "auto_fixed" / "config.pbtxt").exists()
    broken = {p.name for p in (models_dir / "broken").iterdir()}
    assert broken == set(gen_models.BROKEN_MODELS) | {"good"}


def test_configs_parse_as_model_config(models_dir):
    for path in configs(models_dir):
        model = path.parent.name
        if model in INVALID_TEXT:
            continue
        cfg = parse(path)
        if model != "wrong_name":
            assert cfg.name == model, path


def test_invalid_configs_fail_where_meant(models_dir):
    with pytest.raises(text_format.ParseError) as ei:
        parse(models_dir / "broken" / "bad_field" / "config.pbtxt")
    assert gen_models.BAD_FIELD_NAME in str(ei.value)
    assert str(ei.value).startswith(f"{gen_models.BAD_FIELD_LINE}:")
    with pytest.raises(text_format.ParseError) as ei:
        parse(models_dir / "broken" / "bad_dtype" / "config.pbtxt")
    assert gen_models.BAD_DTYPE_NAME in str(ei.value)


def test_wrong_name_config_names_another_model(models_dir):
    assert parse(models_dir / "broken" / "wrong_name" / "config.pbtxt").name == gen_models.WRONG_NAME_CONFIG_NAME


def test_custom_filename_parameters(models_dir):
    cfg = parse(models_dir / "simple" / "custom_filename" / "config.pbtxt")
    assert cfg.default_model_filename == "weights.onnx"
    assert {k: v.string_value for k, v in cfg.parameters.items()} == gen_models.CUSTOM_FILENAME_PARAMETERS


def _onnx_io(path):
    m = onnx.load(str(path))
    def conv(vi):
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
        return vi.name, ONNX_TO_CONFIG[vi.type.tensor_type.elem_type], dims
    return [conv(v) for v in m.graph.input], [conv(v) for v in m.graph.output]


@pytest.mark.parametrize("repo", ["dtypes", "simple", "broken"])
def test_configs_agree_with_onnx(models_dir, repo):
    """For every loadable model, the config's tensors (plus the batch dim)
    are exactly the ONNX graph's."""
    for path in sorted((models_dir / repo).glob("*/config.pbtxt")):
        model = path.parent.name
        if model in gen_models.BROKEN_MODELS:
            continue
        cfg = parse(path)
        fname = cfg.default_model_filename or "model.onnx"
        versions = sorted(p for p in path.parent.iterdir() if p.is_dir() and p.name.isdigit())
        assert versions, model
        for v in versions:
            ins, outs = _onnx_io(v / fname)
            if not cfg.input:  # partial config: auto-complete fills these
                continue
            batch = [-1] if cfg.max_batch_size > 0 else []
            want_in = [(t.name, mc.DataType.Name(t.data_type), batch + list(t.dims)) for t in cfg.input]
            want_out = [(t.name, mc.DataType.Name(t.data_type), batch + list(t.dims)) for t in cfg.output]
            assert ins == want_in, (model, v)
            assert outs == want_out, (model, v)


def test_broken_models_are_broken_for_their_reason(models_dir):
    dup = parse(models_dir / "broken" / "dup_input" / "config.pbtxt")
    assert [i.name for i in dup.input] == ["INPUT0", "INPUT0"]
    mbs = parse(models_dir / "broken" / "mbs_mismatch" / "config.pbtxt")
    ins, _ = _onnx_io(models_dir / "broken" / "mbs_mismatch" / "1" / "model.onnx")
    assert mbs.max_batch_size == 8 and ins[0][2] == [2, 3]
    with pytest.raises(Exception):
        onnx.load(str(models_dir / "broken" / "corrupt_onnx" / "1" / "model.onnx"))


def test_onnxruntime_self_check(models_dir):
    plan = gen_models.Plan()
    gen_models.plan_dtypes(plan)
    gen_models.plan_simple(plan)
    gen_models.plan_broken(plan)
    assert gen_models.self_check(models_dir, plan.checks) == []


def test_idempotent_and_prunes(tmp_path):
    out = tmp_path / "m"
    cmd = [sys.executable, str(REPO_ROOT / "scripts" / "gen_models.py"), "--out", str(out), "--no-check"]
    subprocess.run(cmd, check=True, capture_output=True)
    snapshot = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    stale = out / "simple" / "zz_stale_model" / "1" / "model.onnx"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    assert "(0 written, 1 stale removed)" in res.stdout
    assert not (out / "simple" / "zz_stale_model").exists()
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()}
    assert after == snapshot


def test_committed_example_configs_match_generator():
    ex = REPO_ROOT / "configs" / "example-repo"
    assert (ex / "mlp" / "config.pbtxt").read_text() == gen_models.mlp_config()
    assert (ex / "ocr_det" / "config.pbtxt").read_text() == gen_models.ocr_det_config()
    for name in ("mlp", "ocr_det"):
        parse(ex / name / "config.pbtxt")
