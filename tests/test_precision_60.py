"""Issue 60, item 1: a checkpoint's precision (fp8, fp8-block or NVFP4 linear weights; an fp8
KV cache) read from what it declares or given on the command line, held in memory at its own
bytes, its GEMMs and attention priced from the tables measured in that precision, and one line
where a device cannot run it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.latency.source import latency_source
from perfmodel.measured.device_view import resolve_devices
from perfmodel.models.config import load_model
from perfmodel.planning.memory import kv_bytes_per_token, weight_bytes
from perfmodel.planning.step_models import flavor_steps
from reports.commands.speedup import main as speedup_main

CONFIGS = Path(__file__).resolve().parents[1] / "tests" / "data" / "model_configs"
LINEAR = ("qkv", "o", "gate_up", "down")


def write_config(tmp_path, quantization: dict) -> Path:
    config = json.loads((CONFIGS / "Qwen--Qwen3-32B_config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config | {"quantization_config": quantization}))
    return tmp_path


def test_each_declared_scheme_is_read_as_its_format(tmp_path):
    assert load_model(CONFIGS / "Qwen--Qwen3-32B-FP8_config.json").weights == "fp8-block"  # weight_block_size 128
    llama = load_model(CONFIGS / "nvidia--Llama-3.1-70B-Instruct-FP8_config.json")  # ModelOpt's file beside it
    assert (llama.weights, llama.kv_cache, llama.name) == ("fp8", "fp8", "nvidia--Llama-3.1-70B-Instruct-FP8")
    compressed = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
        "kv_cache_scheme": {"num_bits": 8, "type": "float"},
    }
    assert load_model(write_config(tmp_path, compressed)).precision == "fp8 weights, fp8 KV cache"
    nvfp4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": None}
    assert load_model(write_config(tmp_path, nvfp4)).precision == "nvfp4 weights"


@pytest.mark.parametrize(
    ("quantization", "named"),
    [
        ({"quant_method": "awq", "bits": 4}, "awq, 4"),
        ({"quant_method": "fp8", "weight_block_size": [64, 64]}, "weight_block_size [64, 64]"),
        ({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}, "quant_algo 'W4A8_AWQ'"),
    ],
)
def test_a_scheme_without_measured_gemms_is_refused_naming_it(tmp_path, quantization, named):
    with pytest.raises(PerfkitError, match="declares a quantization that is not priced") as caught:
        load_model(write_config(tmp_path, quantization))
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_memory_holds_each_format_at_its_own_bytes():
    model = load_model("llama-3-8b")
    fp8 = model.with_precision("fp8", "fp8")
    # the layers' linear weights at a byte; embeddings and the LM head (2 x 0.53 B) stay 16-bit
    assert weight_bytes(fp8, "bf16") == pytest.approx(weight_bytes(model, "bf16") / 2 + 1.05e9, rel=0.01)
    assert weight_bytes(model.with_precision("nvfp4", None), "bf16") < weight_bytes(fp8, "bf16")
    assert kv_bytes_per_token(fp8, "bf16") * 2 == kv_bytes_per_token(model, "bf16")
    # --weight-format bf16 serves a quantized checkpoint unquantized; None keeps what it declares
    assert fp8.as_served("bf16", None).precision == "fp8 KV cache" and fp8.as_served().precision == fp8.precision


def test_the_step_is_priced_from_the_tables_of_its_precision():
    model = load_model("llama-3-8b")
    bf16 = latency_source("h100-sxm", model, "bf16", stack="vllm")
    fp8 = latency_source("h100-sxm", model.with_precision("fp8", "fp8"), "bf16", stack="vllm")
    linear = [sum(float(s.op_time(op, "decode", 8, 1024, 1)) for op in LINEAR) for s in (bf16, fp8)]
    attention = [float(s.op_time("sdpa", "decode", 64, 8192, 1)) for s in (bf16, fp8)]
    assert linear[1] < 0.8 * linear[0]  # the fp8 grid's GEMMs read half the weight bytes
    assert attention[1] < 0.8 * attention[0]  # an fp8 cache is half the bytes a long decode reads
    assert float(fp8.op_time("lm_head", "decode", 8, 1024, 1)) == float(bf16.op_time("lm_head", "decode", 8, 1024, 1))
    assert "fp8 weights: their GEMMs from the fp8 GEMM grid of the vllm" in fp8.label
    assert "over an fp8 KV cache" in fp8.label


def test_a_device_or_step_that_cannot_run_a_format_says_so_in_one_line(capsys):
    fp8 = load_model("llama-3-8b").with_precision("fp8", None)
    with pytest.raises(PerfkitError, match=r"weights fp8: NVIDIA A100 80GB SXM \(a100-sxm\) cannot run them"):
        latency_source("a100-sxm", fp8, "bf16")
    with pytest.raises(PerfkitError, match="weights nvfp4: .*h100-sxm.* cannot run them"):
        latency_source("h100-sxm", fp8.with_precision("nvfp4", None), "bf16")
    (view,) = resolve_devices(["h100-sxm"])
    with pytest.raises(PerfkitError, match="the traced step is the reference decoder's 16-bit kernels"):
        flavor_steps(view, fp8, "bf16", flavors=("traced",), tracer=lambda *a: None)
    argv = ["--gpu", "a100", "--model", "llama-3-8b", "--weight-format", "fp8", "--tree-size", "8"]
    assert run(speedup_main, [*argv, "--acceleration", "2"]) == 1
    assert "cannot run them" in capsys.readouterr().err


def test_the_roofline_draws_each_format_at_its_bytes_and_a_weight_format_at_its_peak():
    from perfmodel.hardware.specs import find_spec
    from perfmodel.latency.roofline import predict_table
    from perfmodel.latency.roofline_table import format_ceiling
    from perfmodel.models.grid import Grid

    model, spec, grid = load_model("llama-3-8b"), find_spec("h100-sxm"), Grid((1, 8), (512,), (1,))
    tables = [
        predict_table(spec, m, "bf16", grid, ops=("up", "qk", "sdpa"), latency=latency_source(spec.key, m, "bf16"))
        for m in (model, model.with_precision("fp8", None), model.with_precision(None, "fp8"))
    ]
    keyed = [t.set_index(["op", "phase", "batch"]) for t in tables]
    intensity = [t["flops"] / t["bytes"] for t in keyed]
    weights, cache = intensity[1] / intensity[0], intensity[2] / intensity[0]
    assert weights[("up", "decode", 1)] == pytest.approx(2, rel=0.01)  # the weight read at a byte
    assert weights[("qk", "decode", 1)] == 1  # attention is not a quantized layer
    assert cache[("qk", "decode", 1)] > 1.5 and cache[("sdpa", "decode", 8)] > 1.5  # K and V read at a byte
    assert cache[("up", "decode", 1)] == 1
    assert format_ceiling(spec, "fp8").label.startswith("datasheet fp8 (fp8 weights): 1979 TFLOP/s")


def test_a_drafters_head_beside_a_quantized_target_keeps_16_bits():
    # an EAGLE-3 head ships in 16 bits beside an FP8 target: its layer is not priced on the fp8 grid
    from perfmodel.latency.draft_weights import latency_for

    model = load_model("llama-3-8b")
    head = dataclasses.replace(model, name="head", num_layers=1)  # the head's shapes, its own 16-bit weights
    sources = [latency_source("h100-sxm", m, "bf16", stack="vllm") for m in (model, model.with_precision("fp8", None))]
    times = [float(latency_for(s, head).op_time("qkv", "decode", 4, 512, 1)) for s in sources]
    assert times[0] == times[1]
    assert float(sources[1].op_time("qkv", "decode", 4, 512, 1)) < times[0]  # the target's own layer: fp8


def test_nvfp4_runs_where_the_spec_states_an_fp4_peak_from_the_blackwell_grids():
    nvfp4 = load_model("llama-3-8b").with_precision("nvfp4", None)
    source = latency_source("b200", nvfp4, "bf16", stack="trtllm")
    assert "nvfp4 weights: their GEMMs from the nvfp4 GEMM grid of the trtllm" in source.label
    bf16 = latency_source("b200", load_model("llama-3-8b"), "bf16", stack="trtllm")
    # memory-bound at 64 rows: a quarter of the weight bytes, well under the 16-bit time
    assert float(source.op_time("gate_up", "decode", 64, 512, 1)) < float(bf16.op_time("gate_up", "decode", 64, 512, 1))


@pytest.mark.parametrize(("option", "value"), [("--weight-format", "int4"), ("--kv-cache-dtype", "fp4")])
def test_a_format_outside_the_choices_is_a_usage_error_naming_them(capsys, option, value):
    with pytest.raises(SystemExit):
        speedup_main(["--gpu", "h100", "--model", "llama-3-8b", option, value])
    err = capsys.readouterr().err
    assert f"invalid choice: '{value}'" in err and "fp8" in err
