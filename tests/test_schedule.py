"""The speculation schedule: its bands tile the (batch x context) grid, pick the tree the one
rule picks, run the drafter asked for (Medusa, EAGLE, a draft model, or the best per band),
and load back from every engine's export in that engine's documented form; its regret
against the shipped CPU closed loop is 0 exactly where it chose the measured best."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex

import numpy as np
import pandas as pd
import pytest
import yaml

from perfmodel.acceptance.rates import PAPER_ACCEPTANCE
from perfmodel.base.errors import PerfkitError
from perfmodel.base.paths import TOOLKIT_ROOT
from perfmodel.cli import run
from perfmodel.measured.device_view import resolve_devices
from perfmodel.models.config import load_model
from perfmodel.planning import engine_export_vllm as vllm_export
from perfmodel.planning import engine_exports as ex
from perfmodel.planning.deployment import DeploymentChoices, resolve
from perfmodel.planning.drafter_choice import best_drafters
from perfmodel.planning.drafters import DRAFT_SIZES, drafters_for
from perfmodel.planning.schedule import ScheduleRequest, build_schedule, speculation_schedule
from perfmodel.planning.schedule_format import FORMAT, OFF, ScheduleBand, SpeculationSchedule
from perfmodel.planning.schedule_regret import read_closed_loops, schedule_regret, stored_closed_loop_files
from perfmodel.planning.simulations import CANDIDATE_SIZES, mark_best, pick_best, speedup_table
from perfmodel.planning.step_models import flavor_steps

CPU = "cpu-intel-xeon-processor-2c"  # the stored CPU with closed-loop runs, named so any machine reads it
TWIN = TOOLKIT_ROOT / "profilers" / "measurements" / CPU / "twin"
RECORD = TWIN / "bundled-greedy-record.json"
EAGLE_RECORD = TOOLKIT_ROOT / "docs" / "results" / "data" / "acceptance-eagle-greedy.json"
TINYLLAMA = "decoder/assets/configs/tinyllama-1.1b"
# A small grid for the other drafters' schedules: each builds in well under a second.
SMALL = dict(batches=[1, 8, 64], contexts=[512, 2048])


@pytest.fixture(scope="module")
def a100():
    return speculation_schedule("llama-7b", "a100")


@pytest.fixture(scope="module")
def measured_heads():
    """A schedule whose trees come from measured head accuracies, and its chain schedule."""
    trees = speculation_schedule("llama-7b", "a100", acceptance=str(RECORD))
    chains = speculation_schedule("llama-7b", "a100", acceptance=str(RECORD), family="chain")
    return trees, chains


def covering(schedule: SpeculationSchedule, batch: int, context: int) -> list[ScheduleBand]:
    return [
        b for b in schedule.bands if b.batch_min <= batch <= b.batch_max and b.context_min <= context <= b.context_max
    ]


# ----------------------------------------------------------------------------- bands


def test_bands_tile_the_grid_without_gaps_or_overlaps(a100):
    top_batch, top_context = max(a100.batch_grid), max(a100.context_grid)
    for batch in range(1, top_batch + 1):
        for context in (1, 511, 512, 700, 1023, 1024, 2047, top_context):
            (band,) = covering(a100, batch, context)  # exactly one
            assert a100.band(batch, context) == band


def test_the_floor_rule_and_vectorised_lookup(a100):
    # batch 3 runs batch 2's tree, context 700 context 512's; beyond the grid, the edge band
    assert a100.band(3, 700) == a100.band(2, 512)
    assert a100.band(10_000, 100_000) == a100.band(max(a100.batch_grid), max(a100.context_grid))
    batches, contexts = np.array([1, 3, 40, 300, 7]), np.array([100, 700, 2048, 5000, 1500])
    expected = [a100.band(b, c).tree_size for b, c in zip(batches, contexts)]
    assert a100.tree_size(batches, contexts).tolist() == expected
    assert len(set(expected)) > 2  # the points do not all share one band


def test_the_schedule_picks_what_pick_best_picks_at_grid_points(a100):
    view = resolve_devices(["a100"])[0]
    step = flavor_steps(view, load_model("llama-7b"), "fp16")["full"]
    sizes = [n for n in CANDIDATE_SIZES if n <= 64]  # the paper preset's trees: the Vicuna tree's 64 tokens
    table = speedup_table(step, PAPER_ACCEPTANCE, a100.batch_grid, a100.context_grid, sizes)
    best = pick_best(table)
    for row in best.itertuples():
        band = a100.band(row.batch, row.seq_len)
        assert band.tree_size == row.tree_size, (row.batch, row.seq_len)
        assert band.speedup <= row.speedup + 1e-12  # a band promises its lowest grid point
    assert {b.tree_size for b in a100.bands} >= {1, 64}  # a100 speculates at batch 1, not at 256


def test_medusa_on_off_and_auto(a100):
    off = speculation_schedule("llama-7b", "a100", medusa="off")
    assert [(b.tree_size, b.paths) for b in off.bands] == [(1, ())]
    on = speculation_schedule("llama-7b", "a100", medusa="on")
    assert all(b.tree_size > 1 for b in on.bands)
    assert a100.band(256, 512).tree_size == 1 and on.band(256, 512).speedup < 1  # on runs a tree that loses
    assert a100.band(1, 512).tree_size == on.band(1, 512).tree_size  # where a tree wins, the same one


def test_a_model_without_heads_decodes_plainly():
    model = dataclasses.replace(load_model("llama-7b"), medusa_heads=0)
    schedule = speculation_schedule(model, "a100", medusa="on")
    assert {b.tree_size for b in schedule.bands} == {1}
    assert any("no Medusa heads" in note for note in schedule.notes)


def test_paths_are_the_tree_of_the_band_size(a100, measured_heads):
    for schedule in (a100, *measured_heads):
        for band in schedule.bands:
            assert len(band.paths) == band.tree_size - 1
            assert all(p[:-1] in set(band.paths) for p in band.paths if len(p) > 1)
    trees, chains = measured_heads
    assert any(b.tree_size > 5 for b in trees.bands)
    assert all(all(set(p) == {0} for p in b.paths) and b.tree_size <= 5 for b in chains.bands)


def test_tensor_parallel_prices_the_shard():
    tp2 = speculation_schedule("llama-7b", "a100", tensor_parallel=2)
    assert tp2.tp == 2 and "tp=2" in tp2.latency


def test_bad_bands_are_refused(a100):
    band = a100.bands[0]
    with pytest.raises(PerfkitError, match="gap"):
        dataclasses.replace(a100, bands=a100.bands[1:])
    with pytest.raises(PerfkitError, match="gap"):
        wide = a100.bands[1]  # batch 2-7: ending it at 6 leaves batch 7 to no band
        shrunk = dataclasses.replace(wide, batch_max=wide.batch_max - 1)
        dataclasses.replace(a100, bands=tuple(shrunk if b is wide else b for b in a100.bands))
    with pytest.raises(PerfkitError, match="overlaps"):
        dataclasses.replace(a100, bands=(*a100.bands, band))


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, said",
    [
        (lambda: speculation_schedule("llama-7b", "a100", medusa="maybe"), "'maybe'"),
        (lambda: speculation_schedule("llama-7b", "a100", tensor_parallel=3), "tensor parallel 3 cannot be served"),
        (lambda: speculation_schedule("llama-7b", "a100", family="bush"), "'bush'"),
        (lambda: ex.check_engines(["vllm", "trt"]), "'trt'"),
        (lambda: SpeculationSchedule.from_json('{"format": "x"}'), "not a speculation schedule"),
        (lambda: SpeculationSchedule.from_json(json.dumps({"format": FORMAT, "version": 3})), "version 3"),
        (lambda: speculation_schedule("llama-7b", "a100", drafter="sideways"), "'sideways'"),
        # a Medusa record is the heads' acceptance, not EAGLE's: named, with what EAGLE takes
        (lambda: speculation_schedule("llama-7b", "a100", drafter="eagle", acceptance=str(RECORD)), str(RECORD)),
        (lambda: speculation_schedule("llama-7b", "a100", drafter="eagle", acceptance="paper"), "not of eagle"),
    ],
)
def test_bad_input_is_one_line(call, said):
    with pytest.raises(PerfkitError) as error:
        call()
    assert said in str(error.value) and "\n" not in str(error.value)


def test_the_command_says_bad_input_in_one_line(capsys):
    from perfmodel.schedule import main

    assert run(main, ["--gpu", "a100", "--tp", "3", "--engine", "json"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tensor parallel 3 cannot be served" in err
    with pytest.raises(SystemExit) as exit_:
        main(["--gpu", "a100", "--medusa", "maybe"])
    assert exit_.value.code == 2


def test_vllm_refuses_a_tree_its_medusa_cannot_draft(measured_heads):
    trees, _ = measured_heads
    with pytest.raises(PerfkitError, match="one token per head") as error:
        ex.vllm_files(trees, "heads")
    assert "\n" not in str(error.value)


# ----------------------------------------------------------------------------- exports


def test_our_json_round_trips(a100, tmp_path):
    assert SpeculationSchedule.from_json(a100.to_json()) == a100
    (path,) = ex.write_exports(a100, ["json"], tmp_path)
    assert SpeculationSchedule.load(path) == a100


def test_vllm_configs_load_as_vllm_reads_them(measured_heads):
    _, chains = measured_heads
    files = ex.export_files(chains, "vllm", "org/heads")
    fixed = {name: json.loads(text) for name, text in files.items() if ".tree-" in name}
    assert fixed, "the chains speculate somewhere"
    sizes = {b.tree_size: b for b in chains.bands}
    for name, config in fixed.items():
        # a chain is vLLM's own Medusa draft: no speculative_token_tree (vLLM 0.32.0 refuses the key)
        assert set(config) == {"method", "model", "num_speculative_tokens"}
        assert config["method"] == "medusa" and config["model"] == "org/heads"
        band = sizes[int(name.split(".tree-")[1].split(".")[0])]
        assert band.chain and config["num_speculative_tokens"] == len(band.paths) <= chains.medusa_heads
    dynamic = json.loads(files["speculative-config.dynamic.json"])
    assert dynamic["num_speculative_tokens"] == max(b.draft_tokens for b in chains.bands)
    lookup = vllm_lookup(dynamic["num_speculative_tokens_per_batch_size"])
    for batch in range(1, max(chains.batch_grid) + 1):
        for context in (1, 600, 1024, 2048):
            assert lookup(batch, context) == chains.band(batch, context).draft_tokens, (batch, context)


def vllm_lookup(table):
    """K at (batch, context) as vLLM's validate_and_normalize_dynamic_sd_schedule reads the table
    (vllm/v1/spec_decode/dynamic/utils.py): 3- or 5-item entries, not mixed; batch ranges sorted,
    not overlapping, from 1; a rectangular grid; context ranges contiguous from 1, the last open."""
    assert {len(e) for e in table} in ({3}, {5})
    entries = [(e[0], e[1], 1, 2**31 - 1, e[2]) if len(e) == 3 else tuple(e) for e in table]
    assert all(isinstance(x, int) and x >= 0 for e in entries for x in e)
    batches = sorted({(lo, hi) for lo, hi, *_ in entries})
    contexts = sorted({(e[2], e[3]) for e in entries})
    assert batches[0][0] == 1 and all(a[1] < b[0] for a, b in zip(batches, batches[1:]))
    assert len(entries) == len(batches) * len(contexts)
    assert contexts[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in zip(contexts, contexts[1:]))
    contexts[-1] = (contexts[-1][0], 2**31 - 1)

    def k(batch, context):
        b = max(i for i, (lo, _) in enumerate(batches) if lo <= batch)  # beyond the last range: its K
        c = next(i for i, (_, hi) in enumerate(contexts) if context <= hi)
        (value,) = [e[4] for e in entries if (e[0], e[1]) == batches[b] and e[2] == contexts[c][0]]
        return value

    return k


def test_vllm_batch_only_tables_one_per_context_band(measured_heads):
    _, chains = measured_heads
    files = ex.export_files(chains, "vllm")
    per_context = {n: json.loads(t) for n, t in files.items() if ".dynamic.context-" in n}
    assert len(per_context) == len(vllm_export.k_grid(chains).contexts) > 1
    for name, config in per_context.items():
        lo = int(name.split("context-")[1].split("-")[0])
        lookup = vllm_lookup(config["num_speculative_tokens_per_batch_size"])
        assert all(lookup(b, 1) == chains.band(b, lo).draft_tokens for b in range(1, 300))


def test_tensorrt_llm_yaml_loads_with_its_medusa_choices(a100):
    files = ex.export_files(a100, "tensorrt-llm")
    assert len(files) == len({b.tree_size for b in a100.bands})
    for name, text in files.items():
        assert text.startswith("# medusa-perfkit speculation schedule")
        options = yaml.safe_load(text)
        if name.endswith(".off.yaml"):
            assert options == {}
            continue
        config = options["speculative_config"]
        band = next(b for b in a100.bands if b.tree_size == int(name.split("tree-")[1].split(".")[0]))
        choices = config["medusa_choices"]
        assert choices == [list(p) for p in band.paths]
        assert all(type(r) is int for path in choices for r in path)
        assert all(path[:-1] in choices for path in choices if len(path) > 1)  # TensorRT-LLM needs every prefix
        assert set(config) == {"decoding_type", "max_draft_len", "num_medusa_heads", "medusa_choices"}
        assert config["decoding_type"] == "Medusa" and config["max_draft_len"] == len(choices)
        assert max(map(len, choices)) <= config["num_medusa_heads"] == 4


def sglang_parser() -> argparse.ArgumentParser:
    """SGLang's speculative server arguments, by their documented names and types
    (python/sglang/srt/server_args.py)."""
    p = argparse.ArgumentParser()
    p.add_argument("--speculative-algorithm", type=str, choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"])
    p.add_argument("--speculative-draft-model-path", type=str)
    p.add_argument("--speculative-num-steps", type=int)
    p.add_argument("--speculative-eagle-topk", type=int)
    p.add_argument("--speculative-num-draft-tokens", type=int)
    return p


def test_sglang_arguments_parse_as_sglang_declares_them(measured_heads):
    trees, _ = measured_heads
    files = ex.export_files(trees, "sglang")
    parser = sglang_parser()
    for name, text in files.items():
        words = [w for line in text.splitlines() if not line.startswith("#") for w in shlex.split(line)]
        args = parser.parse_args(words)
        if name.endswith(".off.txt"):
            assert words == [] and args.speculative_algorithm is None
            continue
        band = next(b for b in trees.bands if b.tree_size == int(name.split("tree-")[1].split(".")[0]))
        assert args.speculative_algorithm == "EAGLE" and args.speculative_draft_model_path is None  # no Medusa
        depth = max(map(len, band.paths))
        assert (args.speculative_num_steps, args.speculative_num_draft_tokens) == (depth, band.tree_size)
        assert args.speculative_eagle_topk == 1 + max(max(p) for p in band.paths)
        if args.speculative_eagle_topk == 1:  # SGLang's rule for a chain
            assert args.speculative_num_draft_tokens == args.speculative_num_steps + 1


def test_the_command_writes_every_export(tmp_path, capsys):
    from perfmodel.schedule import main

    out = tmp_path / "schedule"
    assert main(["--gpu", "a100", "--acceptance-rates", str(RECORD), "--out", str(out), "--max-batch", "64"]) == 0
    shown = capsys.readouterr().out
    assert "Speculation schedule: llama-7b on a100-pcie" in shown and "rests on" in shown
    assert {p.name for p in out.iterdir()} == {"schedule.json", "vllm", "sglang", "tensorrt-llm"}
    assert SpeculationSchedule.load(out / "schedule.json").batch_grid == (1, 2, 4, 8, 16, 32, 64)
    assert SpeculationSchedule.load(out / "vllm" / "schedule.json").family == "chain"
    assert main(["--gpu", "a100", "--json", "--engine", "json"]) == 0
    assert SpeculationSchedule.from_json(capsys.readouterr().out).model == "llama-7b"


# ----------------------------------------------------------------------------- drafters


@pytest.fixture(scope="module")
def full_step():
    return flavor_steps(resolve_devices(["a100"])[0], load_model("llama-7b"), "fp16")["full"]


@pytest.fixture(scope="module")
def eagle():
    """EAGLE's schedule (trees) and its chain schedule (vLLM's export) on the small grid."""
    trees = speculation_schedule("llama-7b", "a100", drafter="eagle", **SMALL)
    chains = speculation_schedule("llama-7b", "a100", drafter="eagle", family="chain", **SMALL)
    return trees, chains


@pytest.fixture(scope="module")
def best():
    return speculation_schedule("llama-7b", "a100", drafter="best", **SMALL)


@pytest.fixture(scope="module")
def draft():
    return speculation_schedule("llama-7b", "a100", drafter="draft", **SMALL)


def test_eagle_bands_are_eagles_best_trees_priced_by_its_step(eagle, full_step, a100):
    trees, _ = eagle
    (drafter,) = drafters_for("eagle")  # the EAGLE-2 preset and its step: what the schedule must price with
    table = speedup_table(drafter.step(full_step), drafter.acceptance, SMALL["batches"], SMALL["contexts"])
    for row in pick_best(table).itertuples():
        band = trees.band(row.batch, row.seq_len)
        assert (band.tree_size, band.speedup) == (row.tree_size, pytest.approx(row.speedup)), (row.batch, row.seq_len)
        if band.speculate:
            assert band.drafter == "eagle" and band.paths == ()  # EAGLE-2 draws its tree each step
            assert band.acceptance == pytest.approx(float(drafter.acceptance(band.tree_size)))
            assert band.depth == min(6, band.tree_size - 1) and band.top_k == min(10, band.tree_size - 1)
    assert trees.drafters == ("eagle",) and {b.drafter for b in trees.bands} == {"eagle", OFF}
    assert trees.band(1, 512).speedup > a100.band(1, 512).speedup  # not Medusa's numbers
    assert "EAGLE-2" in trees.acceptance and trees.drafter == "eagle"


def test_an_eagle_record_is_eagles_acceptance():
    schedule = speculation_schedule("llama-7b", "a100", drafter="eagle", acceptance=str(EAGLE_RECORD), **SMALL)
    assert EAGLE_RECORD.name in schedule.acceptance
    preset = speculation_schedule("llama-7b", "a100", drafter="eagle", **SMALL)
    assert schedule.band(1, 512).acceptance != preset.band(1, 512).acceptance


def test_draft_model_bands_carry_their_gamma(draft):
    assert draft.drafters == ("draft",)
    for band in draft.bands:
        assert band.tree_size in DRAFT_SIZES and band.paths == ()
        if band.speculate:
            assert band.drafter == "draft" and band.depth == band.draft_tokens == band.tree_size - 1
            assert band.top_k == 1 and band.chain


def test_best_runs_the_drafter_best_drafters_picks(best, full_step):
    """At every grid point, the drafter and tree perfmodel.planning.drafter_choice.best_drafters
    names over the same drafters, sizes and step."""
    frames = []
    for drafter in drafters_for("all"):
        sizes = drafter.sizes or [n for n in CANDIDATE_SIZES if drafter.name != "medusa" or n <= 64]
        table = speedup_table(drafter.step(full_step), drafter.acceptance, SMALL["batches"], SMALL["contexts"], sizes)
        depth = drafter.depths(table["tree_size"])
        frames.append(mark_best(table).assign(drafter=drafter.name, depth=depth, simulation="s", step="full"))
    chosen = best_drafters(pd.concat(frames, ignore_index=True))
    assert len(chosen) == len(SMALL["batches"]) * len(SMALL["contexts"])
    for row in chosen.itertuples():
        band = best.band(row.batch, row.seq_len)
        assert (band.drafter, band.tree_size) == (row.drafter, row.tree_size), (row.batch, row.seq_len)
        assert band.speedup <= row.speedup + 1e-12
    assert len(best.drafters) >= 2  # the grid makes it choose


def test_the_printed_bands_say_their_drafter(tmp_path, capsys):
    from perfmodel.schedule import main

    common = ["--gpu", "a100", "--batch", "1", "8", "64", "--context", "512", "2048", "--out", str(tmp_path)]
    assert main([*common, "--drafter", "best"]) == 0
    shown = capsys.readouterr().out
    assert "drafter best, speculation auto" in shown.splitlines()[0]
    bands = shown.split("its grid points):\n")[1].split("\n  note:")[0].splitlines()
    assert "drafter" in bands[0].split() and len(bands) > 2
    assert any("EAGLE" in line and "d=6 k=10" in line for line in bands[1:])
    assert any("draft model" in line and "gamma=" in line for line in bands[1:])
    assert SpeculationSchedule.load(tmp_path / "schedule.json").drafter == "best"
    assert main([*common, "--drafter", "medusa", "--engine", "json"]) == 0  # Medusa's table as it always read
    assert "drafter" not in capsys.readouterr().out.split("its grid points):\n")[1].splitlines()[0].split()


def test_drafter_schedules_round_trip_and_a_version_1_file_loads(a100, eagle, best, draft):
    for schedule in (*eagle, best, draft):
        assert SpeculationSchedule.from_json(schedule.to_json()) == schedule
        assert json.loads(schedule.to_json())["version"] == 2
    # version 1: Medusa's bands without drafter, depth or top_k, and no drafter setting
    data = json.loads(a100.to_json())
    old = data | {
        "version": 1,
        "bands": [{k: v for k, v in b.items() if k not in ("drafter", "depth", "top_k")} for b in data["bands"]],
    }
    del old["drafter"]
    loaded = SpeculationSchedule.from_json(json.dumps(old))
    assert loaded == a100 and loaded.drafter == "medusa"
    assert {b.drafter for b in loaded.bands} == {"medusa", OFF}


def test_a_medusa_record_with_drafter_eagle_is_refused_in_one_line(capsys):
    from perfmodel.schedule import main

    assert (
        run(main, ["--gpu", "a100", "--drafter", "eagle", "--acceptance-rates", str(RECORD), "--engine", "json"]) == 1
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(RECORD) in err and "eagle" in err


def test_eagle_exports_parse_as_each_engine_reads_them(eagle):
    trees, chains = eagle
    sizes = {b.tree_size: b for b in trees.bands}
    parser = sglang_parser()
    for name, text in ex.export_files(trees, "sglang", "org/eagle").items():
        args = parser.parse_args(
            [w for line in text.splitlines() if not line.startswith("#") for w in shlex.split(line)]
        )
        if name.endswith(".off.txt"):
            assert args.speculative_algorithm is None
            continue
        band = sizes[int(name.split(".eagle-")[1].split(".")[0])]
        assert (args.speculative_algorithm, args.speculative_draft_model_path) == ("EAGLE", "org/eagle")
        steps, topk, tokens = args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens
        assert (steps, topk, tokens) == (band.depth, band.top_k, band.tree_size)
        # SGLang keeps the num_draft_tokens - 1 best of topk + (steps - 1) topk^2 drafts; topk 1 is a chain
        assert tokens - 1 <= topk + (steps - 1) * topk**2 and (topk > 1 or tokens == steps + 1)
    for name, text in ex.export_files(trees, "tensorrt-llm", {"eagle": "org/eagle"}).items():
        options = yaml.safe_load(text)
        if name.endswith(".off.yaml"):
            assert options == {}
            continue
        config = options["speculative_config"]
        band = sizes[int(name.split(".eagle-")[1].split(".")[0])]
        assert config == {
            "decoding_type": "Eagle",
            "max_draft_len": band.tree_size - 1,
            "num_eagle_layers": band.depth,
            "max_non_leaves_per_layer": band.top_k,
            "use_dynamic_tree": True,
            "dynamic_tree_max_topK": band.top_k,
            "speculative_model": "org/eagle",
        }
    with pytest.raises(PerfkitError, match="one token per pass") as error:
        ex.export_files(trees, "vllm")  # EAGLE-2's trees are no chains
    assert "\n" not in str(error.value)
    files = ex.export_files(chains, "vllm", "org/eagle")
    fixed = {name: json.loads(text) for name, text in files.items() if ".eagle-" in name}
    assert fixed and all(b.chain for b in chains.bands)
    for config in fixed.values():
        assert set(config) == {"method", "model", "num_speculative_tokens"}
        assert (config["method"], config["model"]) == ("eagle", "org/eagle")
    dynamic = json.loads(files["speculative-config.dynamic.json"])
    assert (dynamic["method"], dynamic["model"]) == ("eagle", "org/eagle")
    lookup = vllm_lookup(dynamic["num_speculative_tokens_per_batch_size"])
    for batch in (1, 7, 8, 63, 64, 300):
        for context in (1, 600, 2048):
            assert lookup(batch, context) == chains.band(batch, context).draft_tokens, (batch, context)


def test_draft_model_exports_name_the_draft_model(draft):
    files = ex.export_files(draft, "vllm", "org/small")
    configs = [json.loads(t) for n, t in files.items() if ".draft-gamma-" in n]
    assert configs and all(c["method"] == "draft_model" and c["model"] == "org/small" for c in configs)
    assert json.loads(files["speculative-config.dynamic.json"])["method"] == "draft_model"
    for name, text in ex.export_files(draft, "sglang").items():
        args = sglang_parser().parse_args(shlex.split(text.splitlines()[-1]) if not name.endswith("off.txt") else [])
        if args.speculative_algorithm:
            assert (args.speculative_algorithm, args.speculative_eagle_topk) == ("STANDALONE", 1)
            assert args.speculative_num_draft_tokens == args.speculative_num_steps + 1
            assert args.speculative_draft_model_path == "llama-7b-draft"  # the placeholder to replace
    for name, text in ex.export_files(draft, "tensorrt-llm").items():
        options = yaml.safe_load(text)
        if options:
            gamma = int(name.split("gamma-")[1].split(".")[0])
            assert options["disable_overlap_scheduler"] is True
            assert options["speculative_config"] == {
                "decoding_type": "DraftTarget",
                "max_draft_len": gamma,
                "speculative_model": "llama-7b-draft",
            }


def test_vllm_gets_no_dynamic_table_where_the_bands_run_several_drafters():
    # a costly draft model: EAGLE's chains win at some points, the draft model's at others
    chains = speculation_schedule("llama-7b", "a100", drafter="best", family="chain", cost_ratio=0.2, **SMALL)
    assert set(chains.drafters) == {"eagle", "draft"}
    files = ex.export_files(chains, "vllm", {"eagle": "org/eagle", "draft": "org/small"})
    assert not any("dynamic" in name for name in files)
    methods = {json.loads(t)["method"] for n, t in files.items() if n.startswith("speculative-config.")}
    assert methods == {"eagle", "draft_model"}
    assert "EAGLE, draft model" in vllm_export.vllm_note(chains)


def test_weights_are_named_per_drafter(best):
    assert ex.drafter_weights(best, {"eagle": "org/e"}) == {
        "medusa": "llama-7b-medusa",
        "eagle": "org/e",
        "draft": "llama-7b-draft",
    }
    for given, said in (("org/e", "DRAFTER=PATH"), ({"hydra": "x"}, "'hydra'")):
        with pytest.raises(PerfkitError, match=said) as error:
            ex.drafter_weights(best, given)
        assert "\n" not in str(error.value)
    from perfmodel.schedule import weights_arg

    assert weights_arg(["org/e"]) == "org/e" and weights_arg(["eagle=org/e", "draft=a=b"]) == {
        "eagle": "org/e",
        "draft": "a=b",
    }
    with pytest.raises(PerfkitError, match="one PATH"):
        weights_arg(["org/e", "draft=org/d"])


# ----------------------------------------------------------------------------- regret


@pytest.fixture(scope="module")
def twin_regret():
    schedule = speculation_schedule(TINYLLAMA, CPU, dtype="bf16", acceptance=str(RECORD), batches=[1, 2, 4, 8])
    rows = read_closed_loops(stored_closed_loop_files(CPU))
    rows = rows[(rows["model"] == "tinyllama-1.1b") & (rows["dtype"] == "bf16")]
    return schedule, schedule_regret(schedule, rows)


def test_regret_is_zero_exactly_where_the_schedule_chose_the_measured_best(twin_regret):
    schedule, regret = twin_regret
    assert schedule.bands[0].evidence == "ceilings"
    assert len(regret) >= 16  # four runs x batches 1, 2, 4, 8
    assert (regret["regret"] >= 0).all()
    assert ((regret["regret"] > 0) == (regret["measured_tree"] != regret["best_tree"])).all()
    assert (regret["regret"] == 0).any() and (regret["regret"] > 0).any()
    looked_up = [schedule.tree_size(b, c) for b, c in zip(regret["batch"], regret["context"])]
    assert (regret["schedule_tree"] == looked_up).all()
    assert not regret.loc[~regret["exact"], "measured_tree"].eq(regret.loc[~regret["exact"], "schedule_tree"]).any()


def test_regret_on_made_up_points(a100):
    chosen = int(a100.tree_size(1, 512))  # 64 tokens
    measured = pd.DataFrame(
        {
            "batch": [1, 1, 1, 256, 256, 1, 1],
            "context": [512, 512, 512, 512, 512, 1500, 1500],
            "tree_size": [chosen, 16, 1, 16, 48, 16, 48],
            "measured_speedup": [1.5, 2.0, 1.0, 1.2, 0.9, 1.9, 1.4],
        }
    )
    regret = schedule_regret(a100, measured).set_index(["batch", "context"])
    assert regret.loc[(1, 512), "best_tree"] == 16 and regret.loc[(1, 512), "regret"] == pytest.approx(0.5)
    assert regret.loc[(1, 512), "regret_pct"] == pytest.approx(25.0) and regret.loc[(1, 512), "exact"]
    # off at batch 256: plain decoding (added, speedup 1) stands for it, against a measured 1.2
    assert regret.loc[(256, 512), "schedule_tree"] == 1 and regret.loc[(256, 512), "regret"] == pytest.approx(0.2)
    # 64 tokens not measured at context 1500: the nearest size in ratio, 48, stands for it
    point = regret.loc[(1, 1500)]
    assert (point["schedule_tree"], point["measured_tree"], point["exact"]) == (64, 48, False)
    assert point["regret"] == pytest.approx(0.5)
    with pytest.raises(PerfkitError, match="measured_speedup"):
        schedule_regret(a100, measured.drop(columns="measured_speedup"))


def test_build_schedule_takes_any_step_and_grid():
    view = resolve_devices(["h100"])[0]
    model = load_model("llama-7b")
    step = flavor_steps(view, model, "fp16")["full"]  # any step model, here the full step's
    (deployment,) = resolve(model, [view], DeploymentChoices(dtype="fp16"))
    schedule = build_schedule(step, ScheduleRequest("paper", [1, 16], [1000, 3000]), deployment)
    assert schedule.batch_grid == (1, 16) and schedule.context_grid == (1000, 3000)
    assert (schedule.device, schedule.dtype, schedule.tp) == ("h100-sxm", "fp16", 1)
    assert any("beyond llama-7b's 2048-token context" in note for note in schedule.notes)
    assert schedule.band(16, 999) == schedule.band(16, 1)  # below the grid: the first band


def test_the_documented_cpu_regret_command(tmp_path, capsys):
    """docs/schedules.md's CPU command: it scores the schedule against the twin runs, and the
    schedule loses less to the measured best than never speculating does."""
    from perfmodel.schedule import main

    common = [
        "--model",
        TINYLLAMA,
        "--gpu",
        CPU,
        "--dtype",
        "bf16",
        "--acceptance-rates",
        str(RECORD),
        "--max-batch",
        "8",
        "--out",
        str(tmp_path),
    ]
    mean = {}
    for medusa in ("auto", "off"):
        assert main([*common, "--medusa", medusa]) == 0
        shown = capsys.readouterr().out
        assert "Regret against the closed loop (tinyllama-1.1b-bf16-run1.csv" in shown
        mean[medusa] = float(shown.split("mean regret ")[1].split()[0])
    assert 0 < mean["auto"] < mean["off"]
