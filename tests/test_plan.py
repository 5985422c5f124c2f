import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.latency.allreduce import all_reduce_source, tp_comm_time_per_step
from perfmodel.latency.source import latency_source
from perfmodel.latency.step import StepModel
from perfmodel.latency.tensor_parallel import tensor_parallel_steps
from perfmodel.measured.device_view import resolve_view
from perfmodel.models.config import load_model
from perfmodel.planning.capacity import plan
from perfmodel.planning.lengths import Lengths
from perfmodel.planning.memory import head_params, kv_bytes_per_token, weight_params
from perfmodel.planning.result import BAND_COLUMNS
from reports.commands.plan import benchmark, main

ROOT = Path(__file__).resolve().parents[1]


def test_llama_7b_memory_matches_a_hand_count():
    model = load_model("llama-7b")
    # embeddings + lm_head: 2 x 32000 x 4096; per layer: q, k, v, o 4 x 4096^2, gate, up,
    # down 3 x 4096 x 11008, two norms 2 x 4096; 32 layers; final norm 4096.
    layer = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert weight_params(model) == 2 * 32000 * 4096 + 32 * layer + 4096 == 6_738_415_616
    # each Medusa head: residual block weight and bias 4096^2 + 4096, projection 4096 x 32000.
    assert head_params(model) == 4 * (4096 * 4096 + 4096 + 4096 * 32000) == 591_413_248
    assert kv_bytes_per_token(model, "fp16") == 2 * 32 * 32 * 128 * 2 == 524_288

    row = plan("llama-7b", "a100", prompt_len=512, response_len=256).devices.iloc[0]
    assert row["weights_gb"] == pytest.approx(13.476831232)
    assert row["heads_gb"] == pytest.approx(1.182826496)
    # (80 GB x 0.9 - weights - heads) / (768 tokens x 0.5 MiB) = 57.34e9 / 402.65e6 = 142.4
    assert row["usable_gb"] == pytest.approx(72.0)
    assert row["max_batch"] == 142


def test_max_batch_grows_with_memory_and_shrinks_with_context():
    by_device = plan("llama-7b", ["rtx-4090", "a100", "h200"]).devices.set_index("device")["max_batch"]
    assert by_device["rtx-4090"] < by_device["a100-pcie"] < by_device["h200"]
    short, long = (plan("llama-7b", "a100", prompt_len=p).devices["max_batch"].iloc[0] for p in (512, 4096))
    assert long < short


def test_bands_stop_at_the_max_batch_and_include_it():
    result = plan("llama-7b", "a100", prompt_len=4096, response_len=1024)
    max_batch = result.devices["max_batch"].iloc[0]
    assert list(result.bands.columns) == BAND_COLUMNS
    assert result.bands["batch"].max() == max_batch and max_batch not in (1, 2, 4, 8, 16, 32, 64, 128, 256)
    assert (result.bands["memory_gb"] <= result.devices["usable_gb"].iloc[0]).all()


def test_speculate_at_small_batch_but_not_at_large_batch_on_a100():
    bands = plan("llama-7b", "a100").bands.set_index("batch")
    assert bands.loc[1, "speculate"] and bands.loc[1, "speedup"] > 1.5 and bands.loc[1, "tree"] != "none"
    assert bands.loc[128, "tree"] == "none" and not bands.loc[128, "speculate"] and bands.loc[128, "speedup"] == 1.0
    # speeds follow from the step time and acceptance of the chosen tree
    row = bands.loc[1]
    assert row["per_token_ms"] == pytest.approx(row["medusa_step_s"] / row["acceptance"] * 1e3)
    assert bands.loc[4, "total_tokens_s"] == pytest.approx(4 * bands.loc[4, "user_tokens_s"])
    assert "none (plain decoding is faster)" in plan("llama-7b", "a100").summary()


def test_latency_target_picks_the_fastest_batch_that_meets_it():
    loose, tight = (plan("llama-7b", "a100", latency_target_s=t).devices.iloc[0] for t in (0.030, 0.008))
    assert tight["batch"] < loose["batch"] and tight["per_token_ms"] <= 8 and loose["per_token_ms"] <= 30
    bands = plan("llama-7b", "a100", latency_target_s=0.030).bands
    assert (bands["meets_latency"] == (bands["per_token_ms"] <= 30)).all()
    met = bands[bands["meets_latency"]]
    assert loose["total_tokens_s"] == pytest.approx(met["total_tokens_s"].max())


def test_devices_needed_for_a_throughput_target():
    row = plan("llama-7b", "h100", latency_target_s=0.030, throughput_target=20_000).devices.iloc[0]
    assert row["devices_needed"] == math.ceil(20_000 / row["total_tokens_s"]) > 1
    assert plan("llama-7b", "h100").devices["devices_needed"].iloc[0] == 1  # no target: one replica


def test_model_too_big_for_the_device_names_the_devices_it_needs():
    with pytest.raises(
        PerfkitError, match=r"llama-2-70b in fp32 fits on none.*l40s.*281.2 GB.*needs 8 devices in tensor parallel"
    ):  # 6.5 devices' worth of memory, but only degrees that split 64 heads can be used
        plan("llama-2-70b", "l40s", dtype="fp32")
    with pytest.raises(  # 13 RTX 4090s' worth, past the 4-card PCIe rings its all-reduces are priced on
        PerfkitError, match=r"rtx-4090.*281.2 GB.*no tensor-parallel degree holds it: rtx-4090 can use 1, 2, 4"
    ):
        plan("llama-2-70b", "rtx-4090", dtype="fp32")
    # a device that does not fit beside one that does: a row that says so, no bands
    result = plan("llama-2-70b", ["rtx-4090", "h200"], tensor_parallel=2)
    rows = result.devices.set_index("device")
    assert not rows.loc["rtx-4090", "fits"] and "no tensor-parallel degree holds it" in rows.loc["rtx-4090", "note"]
    assert rows.loc["h200", "fits"] and set(result.bands["device"]) == {"h200"}


def test_auto_tensor_parallel_picks_the_most_tokens_per_device_and_counts_every_device():
    row = plan("llama-2-70b", "a100-sxm", tensor_parallel=None, throughput_target=1_000).devices.iloc[0]
    tp = row["tensor_parallel"]
    assert row["devices_needed"] == tp * math.ceil(1_000 / row["total_tokens_s"])
    with pytest.raises(PerfkitError, match="needs 2 devices"):
        plan("llama-2-70b", "a100-sxm", tensor_parallel=1)
    per_device = {}
    for degree in (2, 4, 8):
        fixed = plan("llama-2-70b", "a100-sxm", tensor_parallel=degree, throughput_target=1_000).devices.iloc[0]
        per_device[degree] = fixed["total_tokens_s"] / degree
    assert tp == max(per_device, key=per_device.get)


def test_unmet_latency_target_is_a_message_not_a_crash():
    result = plan("llama-7b", ["a100", "h100"], latency_target_s=0.0005)
    assert not result.feasible and not result.devices["meets_latency"].any()
    assert result.devices["devices_needed"].isna().all()
    assert "No device meets 0.5 ms per token: the fastest is h100-sxm" in result.summary()


def test_length_distributions_size_memory_by_p95_and_latency_by_mean():
    assert Lengths.of(512) == Lengths(512.0, 512)
    assert Lengths.of((300, 1000)) == Lengths(300.0, 1000)
    samples = Lengths.of(list(range(1, 101)))
    assert samples.mean == 50.5 and samples.p95 == 96
    result = plan("llama-7b", "a100", prompt_len=(300, 1000), response_len=[100] * 18 + [1000] * 2)
    assert result.workload.kv_tokens == 1000 + 1000 and result.workload.step_context == round(300 + 190 / 2)
    assert result.devices["kv_mb_per_seq"].iloc[0] == pytest.approx(2000 * 0.524288)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(devices="a101"), "unknown device 'a101'; known devices: .*closest match: a100-pcie"),
        (dict(prompt_len=-5), "prompt_len must be a number of tokens >= 1, got -5"),
        (dict(response_len=0), "response_len must be a number of tokens >= 1, got 0"),
        (dict(prompt_len=(512, 100)), r"p95 \(100\) must be >= the mean"),
        (dict(response_len=[10, -1]), "every sample must be >= 1"),
        (dict(latency_target_s=0), "latency_target_s must be a positive number"),
        (dict(throughput_target=-10), "throughput_target must be a positive number"),
        (dict(memory_reserve=1.5), r"memory_reserve must be a fraction in \[0, 1\)"),
        (dict(tensor_parallel=0), "tensor_parallel must be a positive integer"),
        (dict(batches=[0, 4]), "batches must be positive integers"),
        (dict(dtype="fp12"), "unknown dtype 'fp12'"),
        (dict(prompt_len=10_000_000), "10,000,256-token sequence needs .* GB of KV cache"),
        (dict(acceptance="missing.json"), "cannot read acceptance record"),
    ],
)
def test_bad_input_gives_a_clear_error(kwargs, message):
    args = dict(model="llama-7b", devices="a100") | kwargs
    with pytest.raises(PerfkitError, match=message):
        plan(**args)


def test_acceptance_from_a_decoder_measure_record(tmp_path):
    record = {
        "per_tree_size": [
            {"tree_size": n, "mean_accepted_tokens": acc} for n, acc in ((1, 1.0), (4, 1.85), (16, 2.35), (64, 2.7))
        ],
        "head_topk_accuracy": [
            [0.53, 0.13, 0.07, 0.03],
            [0.43, 0.13, 0.06, 0.03],
            [0.35, 0.1, 0.05, 0.03],
            [0.3, 0.1, 0.05, 0.02],
        ],
    }
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(record))
    result = plan("llama-7b", "a100", acceptance=path)
    # of the record's log fit (7.5% mean error) and head-accuracy model (1.7%), the closer is used
    assert result.acceptance.startswith(
        "best tree from measured accuracies of 4 heads x top-4 (4 points, mean error 1.7%"
    )
    # measured heads saturate (top-4 of 4 heads), so the best tree at batch 1 is smaller than on the paper's log curve
    paper = plan("llama-7b", "a100")
    assert result.bands["tree_size"].iloc[0] < paper.bands["tree_size"].iloc[0]


def test_cli_prints_the_tables_and_writes_csv(tmp_path, capsys):
    csv = tmp_path / "bands.csv"
    assert (
        main(
            [
                "--model",
                "llama-7b",
                "--gpu",
                "a100",
                "h100",
                "--latency-ms",
                "30",
                "--throughput",
                "5000",
                "--csv",
                str(csv),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for text in (
        "max batch",
        "recommended tree",
        "tokens/s in all",
        "devices needed",
        "per_token_ms",
        "meets_latency",
        "Recommended: batch",
        "Fewest devices for 5,000 tokens/s",
    ):
        assert text in out
    bands = pd.read_csv(csv)
    assert list(bands.columns) == BAND_COLUMNS and set(bands["device"]) == {"a100-pcie", "h100-sxm"}


def test_cli_errors_are_one_line(capsys):
    assert run(main, ["--model", "llama-7b", "--gpu", "a101"]) == 1
    assert capsys.readouterr().err.startswith("error: unknown device 'a101'")
    with pytest.raises(SystemExit):  # argparse's usage error, naming the value
        run(main, ["--model", "llama-7b", "--gpu", "a100", "--prompt-len", "-5"])
    assert "argument --prompt-len: must be a number > 0, got '-5'" in capsys.readouterr().err
    assert run(main, ["--model", "llama-7b", "--gpu", "a100", "--prompt-len", "1", "2", "3"]) == 1
    assert "--prompt-len takes a mean and optionally a p95" in capsys.readouterr().err


def test_module_runs_as_a_command():
    done = subprocess.run(
        [sys.executable, "-m", "perfmodel.plan", "--model", "llama-7b", "--gpu", "a100", "--prompt-len", "512", "2048"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "Bands on a100-pcie" in done.stdout and "prompts mean 512, p95 2048 tokens" in done.stdout


def test_benchmark_plans_10000_configurations_and_prints_its_time(capsys):
    # the one-second target is the benchmark command's to print, not a timed unit test's to flake on a busy machine
    count, seconds = benchmark(repeats=1)
    assert count >= 10_000 and seconds > 0
    assert main(["--benchmark"]) == 0
    assert "configurations (device x batch x tree size) in" in capsys.readouterr().out


def test_the_readme_example_runs_and_ends_as_the_readme_says(capsys):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme[readme.index("### Capacity planning") :]
    example = section[
        section.index("```python\n") + len("```python\n") : section.index("```\n", section.index("```python"))
    ]
    promised = re.search(r'# ends: "(.+)"', example).group(1)
    exec(compile(example, "README.md", "exec"), {})
    assert capsys.readouterr().out.rstrip().endswith(promised)


def test_tensor_parallel_steps_pay_for_two_measured_all_reduces_per_layer():
    shard = load_model("llama-2-70b").shard(4)
    result = plan("llama-2-70b", "h100-sxm", tensor_parallel=4, batches=[8], sizes=[16])
    row = result.devices.iloc[0]
    assert "tp=4: 2 all-reduces per layer, measured" in row["latency_model"]
    configs = result.configs.set_index("tree_size")
    comm = tp_comm_time_per_step(shard, 4, 8 * 16, "fp16", all_reduce_source("h100-sxm"))
    compute = StepModel(shard, latency_source("h100-sxm", shard)).step_time(8, result.workload.step_context, 16)
    # 80 layers x 2 all-reduces of 8 x 16 tokens x 8192 x 2 bytes, on top of one shard's compute,
    # and the gather of the tree's and the heads' logits from the vocabulary-split heads
    assert comm > 0.05 * compute
    step = tensor_parallel_steps(resolve_view("h100-sxm", None, []), load_model("llama-2-70b"), "fp16", 4)["full"]
    gather = float(step.gather_time(8, 16, True))
    assert 0 < gather < 0.1 * comm
    assert configs.loc[16, "medusa_step_s"] == pytest.approx(float(compute) + float(comm) + gather)


def test_the_cpu_plans_tensor_parallel_only_over_the_ranks_its_all_reduce_was_measured_at():
    bundled = ROOT / "decoder" / "assets" / "bundled"
    # A model this small runs fastest per device on one process: the gloo all-reduce costs more than it saves.
    assert plan(bundled, "cpu", tensor_parallel=None).devices.iloc[0]["tensor_parallel"] == 1
    two = plan(bundled, "cpu", tensor_parallel=2).devices.iloc[0]
    assert "measured: torch.distributed gloo all_reduce" in two["latency_model"]
    with pytest.raises(PerfkitError, match=r"no measured all-reduce over 4 ranks.*profilers.allreduce --device cpu"):
        plan(bundled, "cpu", tensor_parallel=4)
