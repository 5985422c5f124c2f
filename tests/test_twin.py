"""The performance twin: dummy weights doing a real run's work, by replaying its acceptance."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from decoder.checkpoint import load_checkpoint
from decoder.medusa import Decoder
from decoder.runs import heldout_prompts
from decoder.tree import Drafting, path_of_length, tree_buffers
from decoder.twin import KernelList, Replay, ReplayRecord, dummy_checkpoint, random_prompts, steps_to
from perfmodel.acceptance.record import AcceptanceRecord
from perfmodel.acceptance.trees import greedy_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.cli import run
from perfmodel.models.config import load_model
from profilers.closed_loop.twin import HOST, kernel_class
from profilers.closed_loop.twin_results import main as twin_results_main
from reports.commands.validate import main as validate_main

TINYLLAMA = "decoder/assets/configs/tinyllama-1.1b"


@pytest.fixture(scope="module")
def real_run():
    """The bundled model's real greedy run with its own heads' tree, its kernels listed."""
    ckpt = load_checkpoint("bundled")
    tree = greedy_tree(np.asarray(ckpt.info.get("head_topk_accuracy", np.full((4, 10), 0.5))), 15)
    prompts = heldout_prompts(ckpt, 2, 32, 0)
    kernels = KernelList()
    with kernels:
        result = Decoder(ckpt).generate(prompts, 24, drafting=Drafting(tree))
    return prompts, tree, result, kernels.kernels


@pytest.fixture(scope="module")
def twin():
    return Decoder(dummy_checkpoint("bundled", seed=1))


def test_twin_step_does_the_real_steps_work(real_run, twin):
    prompts, tree, real, kernels = real_run
    assert max(max(r) for r in real.path_lengths) > 1, "the real run must accept drafts for the test to mean much"
    listed = KernelList()
    with listed:
        replayed = twin.generate(prompts, 24, drafting=Drafting(tree), replay=Replay(real.path_lengths))
    assert replayed.path_lengths == real.path_lengths
    assert replayed.steps == real.steps
    assert listed.kernels == kernels


def test_without_the_replay_dummy_weights_do_other_work(real_run, twin):
    prompts, tree, _, kernels = real_run
    listed = KernelList()
    with listed:
        alone = twin.generate(prompts, 24, drafting=Drafting(tree))
    assert all(n == 1 for row in alone.path_lengths for n in row)  # dummy heads guess nothing
    assert listed.kernels != kernels


def test_dummy_weights_are_vllms_dummy_range_and_no_checkpoint_is_read(tmp_path):
    (tmp_path / "config.json").write_text((load_checkpoint("bundled").folder / "config.json").read_text())
    ckpt = dummy_checkpoint(tmp_path, torch.bfloat16, medusa_heads=2)  # a folder with a config.json only
    weights = torch.cat([p.detach().flatten().float() for p in ckpt.model.parameters()])
    assert weights.abs().max() <= 1e-3 and weights.std() > 1e-4
    assert next(ckpt.model.parameters()).dtype == torch.bfloat16
    assert len(ckpt.heads) == 2


def test_the_shipped_tinyllama_config_has_its_published_shapes():
    model = load_model(TINYLLAMA)
    assert (model.hidden_size, model.intermediate_size, model.num_layers) == (2048, 5632, 22)
    assert (model.num_heads, model.num_kv_heads, model.vocab_size) == (32, 4, 32000)
    layer = 4 * model.hidden_size * model.head_dim * (model.num_heads + model.num_kv_heads) // 2
    layer += 3 * model.hidden_size * model.intermediate_size
    params = model.num_layers * layer + 2 * model.vocab_size * model.hidden_size
    assert 1.0e9 < params < 1.2e9  # TinyLlama-1.1B


def test_replay_steps_are_known_before_the_run(real_run, twin):
    prompts, tree, real, _ = real_run
    replay = Replay(real.path_lengths)
    result = twin.generate(prompts, 24, drafting=Drafting(tree), replay=Replay(real.path_lengths))
    assert replay.steps(batch=2, new_tokens=24, batches=1) == result.steps
    assert steps_to([3, 1], 7) == 3  # 3, 4, 7 tokens after each step: the lengths wrap around
    assert Replay([[2], [1]]).take(3) == [[2], [1], [2]]


def test_path_of_length_follows_the_tree_and_refuses_a_deeper_record():
    buffers = tree_buffers(greedy_tree(np.array([[0.9, 0.5], [0.8, 0.4]]), 4), 2, 2)
    path = path_of_length(buffers, 3)
    assert len(path) == 3 and path[0] == 0
    parents = buffers.tree.parents
    assert parents[path[2]] == path[1] and parents[path[1]] == 0
    with pytest.raises(PerfkitError, match="no path of 4 tokens"):
        path_of_length(buffers, 4)


def write_record(path, real, tree_size: int, accuracy) -> None:
    path.write_text(
        json.dumps(
            {
                "per_tree_size": [
                    {"tree_size": tree_size, "mean_accepted_tokens": 2.0, "path_lengths": real.path_lengths}
                ],
                "head_topk_accuracy": np.asarray(accuracy).tolist(),
            }
        )
    )


def test_a_record_with_path_lengths_is_read_and_a_bad_one_refused(tmp_path, real_run):
    _, tree, real, _ = real_run
    ckpt = load_checkpoint("bundled")
    accuracy = ckpt.info.get("head_topk_accuracy", np.full((4, 10), 0.5))
    write_record(tmp_path / "r.json", real, 16, accuracy)
    record = ReplayRecord.load(tmp_path / "r.json")
    assert record.sizes == [16] and record.tree(16) == tree
    with pytest.raises(PerfkitError, match="no run with a 8-token tree; it has 16"):
        record.replay(8)
    data = json.loads((tmp_path / "r.json").read_text())
    data["per_tree_size"][0]["path_lengths"] = [[0, 2]]
    with pytest.raises(PerfkitError, match="path_lengths must be lists"):
        AcceptanceRecord.from_dict(data, "r.json")


def test_random_prompts_are_token_ids_of_the_vocabulary():
    prompts = random_prompts(100, 3, 5, seed=0)
    assert len(prompts) == 3 and all(len(p) == 5 and all(0 < t < 100 for t in p) for p in prompts)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--weights", "dummy"], "needs --replay RECORD"),
        (["--weights", "dummy", "--replay", "r.json", "--flush", "all"], "--flush is for the real closed loop"),
        (["--weights", "dummy", "--replay", "r.json", "--acceptance", "typical"], "--acceptance must be greedy"),
        (["--replay", "r.json"], "are for the twin"),
    ],
)
def test_validate_refuses_what_the_twin_cannot_do(argv, message, capsys):
    with pytest.raises(PerfkitError, match=message):
        validate_main(argv)


def test_measure_runs_a_twin_that_accepts_what_the_record_says(tmp_path, real_run):
    from decoder.measure import main as measure_main

    _, _, real, _ = real_run
    accuracy = load_checkpoint("bundled").info.get("head_topk_accuracy", np.full((4, 10), 0.5))
    write_record(tmp_path / "r.json", real, 16, accuracy)
    out = tmp_path / "twin.json"
    argv = ["--model", "bundled", "--weights", "dummy", "--replay", str(tmp_path / "r.json"), "--prompts", "2"]
    assert measure_main([*argv, "--batch", "2", "--new-tokens", "24", "--out", str(out)]) == 0
    rows = {r["tree_size"]: r for r in json.loads(out.read_text())["per_tree_size"]}
    assert sorted(rows) == [1, 16]
    assert rows[16]["steps"] == Replay(real.path_lengths).steps(batch=2, new_tokens=24, batches=1)
    assert rows[16]["mean_accepted_tokens"] > 1.5 and rows[1]["mean_accepted_tokens"] == 1.0
    with pytest.raises(PerfkitError, match="--tree is for real weights"):
        measure_main([*argv, "--tree", "greedy-8", "--out", str(out)])


def test_the_twin_loop_refuses_a_batch_larger_than_its_prompts():
    from profilers.closed_loop.twin import TwinConfig

    with pytest.raises(PerfkitError, match="--prompts 4 is fewer than batch 8"):
        TwinConfig(model=TINYLLAMA, replay="r.json", batch=8, prompts=4)


def test_the_twin_checks_every_batch_before_it_measures_the_first(capsys):
    # seen on a lent H200: --batch 1 4 16 --prompts 4 measured two batches for minutes, then refused the third
    argv = ["--model", "bundled", "--weights", "dummy", "--replay", "r.json", "--batch", "1", "8", "--prompts", "4"]
    assert run(validate_main, argv) == 1
    captured = capsys.readouterr()
    assert "--prompts 4 is fewer than batch 8" in captured.err and captured.err.count("\n") == 1
    assert "batch 1" not in captured.out + captured.err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without CUDA gives")
def test_the_twin_on_cuda_without_a_gpu_is_a_one_line_error(capsys):
    argv = ["--weights", "dummy", "--replay", "r.json", "--device", "cuda"]
    assert run(validate_main, argv) == 1
    err = capsys.readouterr().err
    assert "--device cuda: no CUDA device is visible" in err and err.count("\n") == 1


def test_twin_results_names_a_missing_run_file_in_one_line(tmp_path, capsys):
    missing = tmp_path / "run.csv"
    assert run(twin_results_main, [str(missing)]) == 1
    err = capsys.readouterr().err
    assert str(missing) in err and "no such file" in err and err.count("\n") == 1


def test_twin_results_reads_a_gpu_check_run_that_profiled_no_kernel_classes(capsys):
    # the GPU check times its twin steps without torch.profiler: no -classes.csv beside them
    check = Path(__file__).resolve().parents[1] / "profilers/measurements/h200/gpu-check-2026-11-27"
    runs = [check / "twin/llama-2-7b-fp16-graph.csv", check / "rerun/eager-r3.csv"]
    assert run(twin_results_main, [str(p) for p in runs]) == 0
    out = capsys.readouterr().out
    assert "llama-2-7b-fp16-graph: kernel classes not profiled in this run" in out
    assert "eager-r3, ms per step by kernel class" in out
    # the re-run has batch 1 only: the graph run's batch-16 rows show '-' for it, never nan
    batch16 = next(line for line in out.splitlines() if line.startswith("| 16 | 64 |"))
    assert "39.1 / -" in batch16 and "nan" not in out


def test_profiled_attention_is_attention_on_every_backend_sdpa_picks():
    # On a GPU the kernels run inside the backend's forward, which the profiler lists as its own
    # operator; counted as host, they went missing from the H100 check's attention class
    # (profilers/measurements/h100-sxm/gpu-check-2026-11-28).
    for name in (
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_efficient_attention_forward",
        "aten::_flash_attention_forward",
        "aten::_cudnn_attention_forward",
    ):
        assert kernel_class(name) == "attention", name
    assert kernel_class("aten::mm") == "gemm" and kernel_class("aten::detach") == HOST
