"""python -m profilers.campaign: the quick CPU campaign writes data-contract files every
reader takes, a rerun does nothing and says so, an interrupted or damaged campaign redoes
only what is missing, and bad input is a one-line error."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from perfmodel.cli import run
from perfmodel.measured.contract import check_table
from perfmodel.measured.store import measured_rows, read_meta
from perfmodel.models.config import PRESETS
from perfmodel.models.operators import PHASES
from profilers import store
from profilers.campaign import main
from profilers.campaign_plan import GemmStage, SweepStage, TwinStage
from profilers.campaign_variants import plan_for
from profilers.closed_loop.twin_print import classes_path
from profilers.device import cpu_info
from profilers.store import output_lock

QUICK = plan_for("cpu", "quick")


def campaign(out: Path, *extra: str) -> int:
    return run(main, ["--device", "cpu", "--quick", "--out", str(out), "--no-progress", *extra])


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One quick campaign, measured once; each test works on its own copy of the folder."""
    out = tmp_path_factory.mktemp("campaign")
    assert campaign(out) == 0
    return out / cpu_info().key


@pytest.fixture
def folder(measured, tmp_path) -> Path:
    copy = tmp_path / "campaign" / measured.name
    shutil.copytree(measured, copy)
    return copy


def manifest(folder: Path) -> dict:
    return json.loads((folder / "campaign.json").read_text())


def contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*.csv"))}


def test_every_stage_writes_data_contract_rows_readers_take(measured):
    key = measured.name
    for stage in QUICK.stages[1:]:
        if isinstance(stage, TwinStage):
            continue  # its own tables: test_the_twin_stage_writes_measured_beside_predicted_steps
        path = measured / stage.out
        raw = check_table(pd.read_csv(path))
        rows = measured_rows(path, device=key)
        assert len(rows) == len(raw) == stage.size(), stage.name
        assert (rows["time_s"] > 0).all() and set(rows["status"]) == {"ok"}
        assert read_meta(path)["runs"], f"{path} has no run metadata"
        if isinstance(stage, SweepStage):
            assert set(rows["model"]) == {"bundled"} and set(rows["op"]) == set(stage.ops)
            assert set(rows["phase"]) == set(stage.phases)
        else:
            assert isinstance(stage, GemmStage) and set(rows["op"]) == {"gemm"}
            assert sorted(set(zip(rows["k"], rows["n"]))) == sorted(stage.shapes)
            assert (rows["flops"] == 2 * rows["seq_len"] * rows["n"] * rows["k"]).all()
            assert (rows["model"] == "gemm-k" + rows["k"].astype(str) + "-n" + rows["n"].astype(str)).all()
    record = json.loads((measured / "ceilings.json").read_text())
    assert record["device"]["key"] == key
    assert record["ceilings"]["peak_tflops"]["fp32"] > 0 and record["ceilings"]["kernel_overhead_us"] > 0
    done = manifest(measured)
    assert [s["status"] for s in done["stages"]] == ["done"] * len(QUICK.stages)
    assert done["versions"]["torch"] == torch.__version__ and done["finished"]
    assert done["runs"][0]["stages"] == QUICK.names()


def test_the_twin_stage_writes_measured_beside_predicted_steps(measured):
    stage = QUICK.stage("twin-bundled")
    table = pd.read_csv(measured / stage.out)
    assert len(table) == stage.size() and sorted(table["tree_size"]) == [1, *stage.sizes]
    assert (table["measured_step_s"] > 0).all() and table["predicted_step_s"].notna().all()
    assert set(pd.read_csv(classes_path(measured / stage.out))["batch"]) == set(stage.batches)
    meta = json.loads((measured / stage.out).with_suffix(".meta.json").read_text())
    assert meta["device"]["key"] == measured.name and meta["batches"]["1"]["calls_not_replayed"] == 0


def test_a_rerun_of_a_complete_campaign_does_nothing_and_says_so(folder, capsys):
    before = contents(folder)
    assert campaign(folder.parent) == 0
    assert "nothing to do: all 5 stages of the quick campaign are complete" in capsys.readouterr().out
    assert contents(folder) == before
    assert len(manifest(folder)["runs"]) == 1  # no run recorded: nothing ran


def test_a_removed_stage_output_is_measured_again_and_only_it(folder, capsys):
    stage = QUICK.stage("attention-bundled")
    (folder / stage.out).unlink()
    kept = {name: data for name, data in contents(folder).items()}
    assert campaign(folder.parent) == 0
    out = capsys.readouterr().out
    assert "ceilings: complete in ceilings.json, skipped" in out and "linear-bundled: complete" in out
    assert f"attention-bundled: {stage.size()} of {stage.size()} to measure" in out
    assert {name: data for name, data in contents(folder).items() if name in kept} == kept
    assert len(measured_rows(folder / stage.out)) == stage.size()
    assert manifest(folder)["runs"][-1]["stages"] == ["attention-bundled"]


@pytest.mark.parametrize("name", ["linear-bundled", "gemm-grid"])
def test_an_interrupted_stage_resumes_where_its_journal_stopped(name, folder, capsys, monkeypatch):
    stage = QUICK.stage(name)
    for path in folder.glob(stage.out + "*"):
        path.unlink()
    appended = []
    real_append = store.Journal.append

    def interrupted_after_7(self, row):
        if len(appended) == 7:
            raise KeyboardInterrupt
        real_append(self, row)
        appended.append(row)

    monkeypatch.setattr(store.Journal, "append", interrupted_after_7)
    assert campaign(folder.parent) == 130
    state = manifest(folder)
    assert state["runs"][-1]["interrupted_in"] == name and state["finished"] is None
    assert {s["name"]: s["status"] for s in state["stages"]}[name] == "running"
    monkeypatch.setattr(store.Journal, "append", real_append)
    capsys.readouterr()
    assert campaign(folder.parent) == 0
    assert f"{name}: {stage.size() - 7} of {stage.size()} to measure" in capsys.readouterr().out
    rows = measured_rows(folder / stage.out)
    assert len(rows) == stage.size() and not rows.duplicated(["model", "op", "seq_len"]).any()
    assert (
        rows["run_id"].nunique() == 2 and manifest(folder)["finished"]
    )  # 7 rows of the first run, the rest of the second


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_gpu_is_a_one_line_error_suggesting_cpu(tmp_path, capsys):
    assert run(main, ["--device", "cuda", "--out", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --device cuda: no CUDA device is visible") and err.endswith("use --device cpu")
    assert "\n" not in err and not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dtype", "fp8"], "operator benchmarks run in fp16, bf16, fp32; 'fp8' is measured as a ceiling only"),
        (["--gpu", "a100"], "--gpu a100 names the GPU whose datasheet prices a cuda --dry-run"),
    ],
)
def test_bad_input_is_a_one_line_error(argv, message, tmp_path, capsys):
    assert campaign(tmp_path, *argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())


def test_a_folder_of_another_dtype_or_a_running_campaign_is_refused(folder, capsys):
    assert campaign(folder.parent, "--dtype", "bf16") == 1
    assert "is a quick fp32 campaign; this one is quick bf16: give another --out" in capsys.readouterr().err
    with output_lock(folder / "campaign.json"):
        assert campaign(folder.parent) == 1
    assert re.search(r"another sweep is writing .*campaign\.json", capsys.readouterr().err)


def test_the_dry_run_prints_the_gpu_plan_within_25_minutes_and_writes_nothing(tmp_path, capsys):
    assert run(main, ["--device", "cuda", "--gpu", "h100", "--dry-run", "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    plan = plan_for("cuda")
    for i, stage in enumerate(plan.stages, 1):
        assert re.search(
            rf"^ *{i}  {re.escape(stage.name)} +{stage.size():,} +\d+:\d\d  {re.escape(stage.out)}$", out, re.M
        )
    total = re.search(r"^total: 9 stages, ([\d,]+) points, estimated (\d+):(\d\d)$", out, re.M)
    assert int(total[1].replace(",", "")) == sum(s.size() for s in plan.stages)
    assert 60 < int(total[2]) * 60 + int(total[3]) <= 25 * 60
    assert "h100-sxm datasheet roofline" in out and not (tmp_path / "c").exists()


def test_the_gpu_plan_covers_the_paper_models_attention_and_every_presets_shards():
    plan = plan_for("cuda")
    linear = [s for s in plan.stages if s.name.startswith("linear-")]
    assert [s.model.name for s in linear] == ["llama-7b", "llama-13b", "llama-33b"]
    tokens = sorted({p[3] for p in linear[0].points})
    assert tokens[:4] == [1, 2, 4, 8] and 136 in tokens and tokens[-1] == 8192
    attention = plan.stage("attention-llama-33b")
    assert set(attention.ops) == {"qk", "pv", "sdpa"} and attention.phases == PHASES
    assert {p[4] for p in attention.points if p[1] == "tree"} == {1, 16, 32, 48, 64, 80, 96, 112}
    gemm = plan.stage("gemm-grid")
    # llama-2-70b at TP 8: 8 query heads and 1 KV head of 128 per device, its qkv 8192 x (8 + 2) x 128
    assert "llama-2-70b@tp8:qkv" in gemm.sources[(8192, 1280)]
    lm_heads = {(m.hidden_size, m.vocab_size) for m in PRESETS.values()}
    assert lm_heads <= set(gemm.shapes) and (4096, 128256) in lm_heads
    assert gemm.tokens[0] == 1 and gemm.tokens[-1] == 4096 and len(set(gemm.shapes)) == len(gemm.shapes)


def test_the_gpu_check_runs_in_small_on_a_cpu_and_resumes(tmp_path, capsys):
    argv = ["--device", "cpu", "--stage", "gpu-check", "--out", str(tmp_path), "--no-progress"]
    assert run(main, argv) == 0
    folder = tmp_path / cpu_info().key
    costs = json.loads((folder / "host-dispatch.json").read_text())
    assert costs["device"] == "cpu" and set(costs["classes"]) >= {"gemm", "elementwise", "host_sync", "python"}
    linear = pd.read_csv(next((folder / "check").glob("*-linear.csv")))
    assert set(linear["seq_len"]) >= {1, 8, 64}
    eager, static = (pd.read_csv(folder / "twin" / f"bundled-fp32{suffix}.csv") for suffix in ("", "-static"))
    assert set(eager["launch"]) == {"eager"} and set(static["launch"]) == {"static"}
    assert set(static["tree_size"]) == {1, 4} and (static["measured_step_s"] > 0).all()
    printed = capsys.readouterr().out
    assert "batch 1, static steps:" in printed and "predicted" in printed
    assert run(main, argv) == 0
    assert "nothing to do: all 4 stages of the gpu-check campaign are complete" in capsys.readouterr().out


def test_the_gpu_check_is_planned_to_fit_a_short_lease(tmp_path, capsys):
    assert run(main, ["--device", "cuda", "--stage", "gpu-check", "--dry-run", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    minutes, seconds = map(int, re.search(r"estimated (\d+):(\d\d)$", printed.strip()).groups())
    assert 60 * minutes + seconds <= 8 * 60
    for stage in ("host-dispatch", "linear-short", "attention-tree", "twin-llama-2-7b ", "twin-llama-2-7b-graph"):
        assert stage in printed
    assert not any(tmp_path.iterdir())
