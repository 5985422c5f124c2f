"""Issue #56, items 1-6 and 15, and its "Also": the models, setups and targets the toolkit
cannot price are refused in one line naming what it cannot price, never answered as some
other model (mixture-of-experts configs as dense ones, FP8 checkpoints as bf16, a 32-way
ring over a two-card bridge, a tree yielding more tokens than it has)."""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest
import yaml

from hw_specs import SPEC_DIR
from perfmodel.cli import run
from perfmodel.hardware.specs import load_spec_file
from perfmodel.latency.source import latency_source
from perfmodel.latency.tensor_parallel import usable_degrees
from perfmodel.models.config import load_model
from reports.__main__ import main as reports_main
from reports.commands.plan import main as plan_main
from reports.commands.speedup import main as speedup_main
from tests.helpers import one_line_error

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "model_configs"  # today's checkpoints' configs (README there)
PLAN = ["--gpu", "h100", "--latency-ms", "50", "--throughput", "1000"]


def one_line(capsys, main, argv) -> str:
    """The one `error:` line a command ends with (exit status 1, nothing else on stderr)."""
    assert run(main, argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


# ----------------------------------------------------------------------------- item 1: mixture of experts


# Mixtral, Qwen2/3-MoE, gpt-oss, Llama-4 and DeepSeek-V3 are read and priced since issue 60
# (tests/test_moe_60.py, tests/test_mla_60.py); DeepSeek-V3.2's sparse attention indexer is not, and an
# MoE model of another model_type is refused on its expert keys.
@pytest.mark.parametrize(
    ("config", "changes", "key", "what"),
    [
        ("deepseek-ai--DeepSeek-V3.2", {}, "index_topk = 2048", "sparse attention indexer"),
        ("deepseek-ai--DeepSeek-V3", {"model_type": "glm4_moe"}, "n_routed_experts = 256", "mixture-of-experts"),
    ],
)
def test_a_mixture_of_experts_config_is_refused_naming_its_key(capsys, tmp_path, config, changes, key, what):
    cfg = json.loads((CONFIGS / f"{config}_config.json").read_text()) | changes
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    err = one_line(capsys, plan_main, ["--model", str(tmp_path), *PLAN])
    assert key in err and what in err


def test_a_decoder_outside_the_llama_family_is_refused_naming_its_model_type(capsys, tmp_path):
    # (Llama-4, refused here before issue 60, is priced as its text decoder: tests/test_moe_60.py)
    config = json.loads((CONFIGS / "Qwen--Qwen3-32B_config.json").read_text()) | {"model_type": "gemma3_text"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    err = one_line(capsys, speedup_main, ["--gpu", "h100", "--model", str(tmp_path)])
    assert "model_type 'gemma3_text' is not priced" in err


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"moe_intermediate_size": 768}, "moe_intermediate_size = 768"),  # experts on a dense model_type
        ({"kv_lora_rank": 512}, "kv_lora_rank = 512 declares latent attention"),
        ({"sliding_window": 4096, "use_sliding_window": True}, "sliding_window = 4096"),
        ({"model_type": "gemma2"}, "model_type 'gemma2'"),
    ],
)
def test_each_key_the_model_cannot_price_is_named(tmp_path, extra, fragment):
    config = json.loads((CONFIGS / "Qwen--Qwen3-32B_config.json").read_text()) | extra
    (tmp_path / "config.json").write_text(json.dumps(config))
    one_line_error(lambda: load_model(tmp_path), fragment)


def test_dense_llama_family_configs_are_still_priced(tmp_path):
    qwen = load_model(CONFIGS / "Qwen--Qwen3-32B_config.json")
    assert (qwen.hidden_size, qwen.num_layers, qwen.head_dim) == (5120, 64, 128)
    # a window as long as the context, or one switched off, changes nothing
    config = json.loads((CONFIGS / "Qwen--Qwen3-32B_config.json").read_text())
    for window in ({"sliding_window": 40960}, {"sliding_window": 4096, "use_sliding_window": False}):
        (tmp_path / "config.json").write_text(json.dumps(config | window))
        assert load_model(tmp_path).hidden_size == 5120
    assert load_model("bundled").num_layers == 4  # the bundled model's config says model_type llama


# ----------------------------------------------------------------------------- item 2: quantized checkpoints


def test_an_fp8_checkpoint_is_not_priced_as_bf16(capsys):
    # refused here until issue 60 priced it in its own precision (tests/test_precision_60.py):
    # on a device without fp8 tensor cores it is still one line, never a bf16 answer
    err = one_line(capsys, plan_main, ["--model", str(CONFIGS / "Qwen--Qwen3-32B-FP8_config.json"), "--gpu", "a100"])
    assert "weights fp8-block: NVIDIA A100" in err and "cannot run them" in err


def test_a_modelopt_fp8_checkpoint_is_read_from_the_file_beside_its_config(tmp_path):
    # as the peer ships it (<name>_hf_quant_config.json beside <name>_config.json) ...
    shipped = load_model(CONFIGS / "nvidia--Llama-3.1-70B-Instruct-FP8_config.json")
    assert (shipped.weights, shipped.kv_cache) == ("fp8", "fp8")
    # ... and as a checkpoint folder holds it
    shutil.copy(CONFIGS / "nvidia--Llama-3.1-70B-Instruct-FP8_config.json", tmp_path / "config.json")
    shutil.copy(CONFIGS / "nvidia--Llama-3.1-70B-Instruct-FP8_hf_quant_config.json", tmp_path / "hf_quant_config.json")
    assert load_model(tmp_path).precision == "fp8 weights, fp8 KV cache"
    (tmp_path / "hf_quant_config.json").unlink()
    assert load_model(tmp_path).precision == ""  # the same config without the file: the bf16 model


def test_fp8_on_a_device_measured_in_other_dtypes_says_its_latency_is_not_measured():
    label = latency_source("h100", "llama-7b", "fp8").label
    assert label.startswith("no fp8 measurements of h100-sxm") and "datasheet" in label
    # a dtype it was measured in keeps its label
    assert latency_source("h100", "llama-7b", "fp16").label.startswith("measured on h100-sxm")


# ----------------------------------------------------------------------------- item 3: tensor-parallel degrees


@pytest.mark.parametrize(("gpu", "key", "largest"), [("a100", "a100-pcie", 2), ("rtx-4090", "rtx-4090", 4)])
@pytest.mark.parametrize("tp", [16, 32])
def test_a_degree_the_interconnect_cannot_serve_is_refused_naming_the_largest(capsys, gpu, key, largest, tp):
    argv = ["--model", "llama-2-70b", "--gpu", gpu, "--tp", str(tp), "--latency-ms", "50", "--throughput", "1000"]
    err = one_line(capsys, plan_main, argv)
    assert f"tensor parallel {tp} cannot be served on {key}" in err
    assert f"the largest degree it can serve for llama-2-70b is {largest}" in err


def test_one_rule_for_measured_and_modelled_collectives(capsys):
    model = load_model("llama-2-70b")
    assert usable_degrees(model, load_spec_file(SPEC_DIR / "a100-pcie.yaml")) == [1, 2]  # the bridge's two cards
    assert usable_degrees(model, load_spec_file(SPEC_DIR / "rtx-4090.yaml")) == [1, 2, 4]  # the PCIe ring's fit
    assert usable_degrees(model, load_spec_file(SPEC_DIR / "h100-sxm.yaml")) == [1, 2, 4, 8]  # NCCL's table
    err = one_line(capsys, speedup_main, ["--model", "llama-2-70b", "--gpu", "h100", "--tp", "16"])
    assert "the largest degree it can serve for llama-2-70b is 8" in err


# ----------------------------------------------------------------------------- item 4: past the longest path


@pytest.mark.parametrize(
    ("tree", "acceleration", "most"),
    [("4", "50", 4), ("2", "3", 2), ("4", "inf", 4), ("64", "5.5", 5), ("8", "nan", 5)],
)
def test_an_acceleration_past_the_trees_longest_path_is_refused(capsys, tree, acceleration, most):
    argv = ["--gpu", "a100", "--model", "llama-7b", "--tree-size", tree, "--acceleration", acceleration]
    err = one_line(capsys, speedup_main, argv)
    assert f"yields 1 to {most} tokens a step" in err


def test_the_longest_path_acceleration_is_still_priced(capsys):
    argv = ["--gpu", "a100", "--model", "llama-7b", "--tree-size", "64", "--acceleration", "5"]
    assert run(speedup_main, argv) == 0
    assert "at acceleration 5" in capsys.readouterr().out


# ----------------------------------------------------------------------------- item 5: a model without heads


def test_a_model_without_heads_gets_no_tree_from_either_command(tmp_path, capsys):
    config = json.loads((ROOT / "decoder" / "assets" / "bundled" / "config.json").read_text()) | {"medusa_num_heads": 0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    err = one_line(capsys, speedup_main, ["--gpu", "h100", "--model", str(tmp_path)])
    assert "has no Medusa heads" in err and "no tree to price" in err
    err = one_line(
        capsys, speedup_main, ["--gpu", "h100", "--model", str(tmp_path), "--tree-size", "8", "--acceleration", "2"]
    )
    assert "has no Medusa heads" in err
    err = one_line(
        capsys, reports_main, ["build", "--gpu", "h100", "--model", str(tmp_path), "--out", str(tmp_path / "r")]
    )
    assert "has no Medusa heads" in err and "no tree to report" in err
    assert run(plan_main, ["--model", str(tmp_path), "--gpu", "h100", "--latency-ms", "30"]) == 0
    out = capsys.readouterr().out
    assert "none (the model has no Medusa heads)" in out and "plain decoding is faster" not in out


# ----------------------------------------------------------------------------- item 6: spec numbers past physics


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory_gb", 1e12),
        ("memory_bandwidth_gb_s", 3.35e12),
        ("boost_clock_mhz", 1.98e9),
        ("interconnect_devices", 1.5),
    ],
)
def test_a_spec_number_outside_physical_ranges_is_refused_at_load(tmp_path, field, value):
    spec = yaml.safe_load((SPEC_DIR / "h100-sxm.yaml").read_text()) | {field: value}
    spec["sources"].setdefault(field, "a test")
    path = tmp_path / "h100-typo.yaml"
    path.write_text(yaml.safe_dump(spec))
    one_line_error(lambda: load_spec_file(path), str(path), repr(field))


def test_peak_tflops_past_any_device_is_refused(tmp_path):
    spec = yaml.safe_load((SPEC_DIR / "h100-sxm.yaml").read_text())
    spec["peak_tflops"]["fp16"] = 1e15  # FLOP/s written where TFLOP/s belong
    path = tmp_path / "h100-flops.yaml"
    path.write_text(yaml.safe_dump(spec))
    one_line_error(lambda: load_spec_file(path), "'peak_tflops.fp16' is 1e+15")


# ----------------------------------------------------------------------------- item 15: targets past any fleet


@pytest.mark.parametrize(
    "argv", [["--throughput", "1e30"], ["--throughput", "1e300"], ["--rate", "1e30", "--tpot-ms", "50"]]
)
def test_a_target_past_any_fleet_is_one_line_not_an_overflow(capsys, argv):
    err = one_line(capsys, plan_main, ["--model", "llama-7b", "--gpu", "h100", "--latency-ms", "30", *argv])
    assert re.search(r"must be at most 1e\+(12|09), got 1e\+(30|300)", err)


# ----------------------------------------------------------------------------- also


def test_requires_python_is_what_the_code_imports():
    packages = ("perfmodel", "profilers", "decoder", "reports", "hw_specs", "tests")
    uses_strenum = [p for package in packages for p in (ROOT / package).rglob("*.py") if "StrEnum" in p.read_text()]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert uses_strenum and project["project"]["requires-python"] == ">=3.11"  # enum.StrEnum is new in 3.11
    assert project["tool"]["ruff"]["target-version"] == "py311"


def test_the_readme_plan_snippet_prints_every_column_it_asks_for(tmp_path, monkeypatch, capsys):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    snippet = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "from perfmodel import plan" in b)
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "README.md", "exec"), {})
    out = capsys.readouterr().out
    lists = re.findall(r"\[((?:\"\w+\", ){2,}\"\w+\")\]", snippet)  # the columns asked for
    assert len(lists) == 2, snippet
    for asked in lists:
        columns = re.findall(r'"(\w+)"', asked)
        header = next(line for line in out.splitlines() if line.split()[:1] == columns[:1])
        assert header.split() == columns, header  # every column, nothing elided ("...")


def test_the_readme_says_how_to_get_the_browser_the_report_tests_need():
    readme, ci = (ROOT / "README.md").read_text(encoding="utf-8"), (ROOT / ".ci" / "run").read_text()
    assert "apt-get install chromium" in readme  # what a newcomer runs
    assert re.search(r"apt-get install -y -qq chromium", ci)  # and what CI runs, so the tests run there
