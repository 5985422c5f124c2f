"""One acceptance policy (perfmodel.acceptance.rates.resolve_acceptance) and one best-tree rule
(perfmodel.planning.simulations.pick_best), shared by the speedup simulations, the capacity plan and
the reports."""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from perfmodel.acceptance.rates import (
    PAPER_ACCEPTANCE,
    AcceptanceChoice,
    HeadAccuracyAcceptance,
    LogAcceptance,
    closer_to_record,
    models_from_record,
    resolve_acceptance,
)
from perfmodel.acceptance.record import AcceptanceRecord
from perfmodel.base.errors import PerfkitError
from perfmodel.planning import simulations
from perfmodel.planning.capacity import plan
from perfmodel.planning.simulations import best_sizes, mark_best, optima, pick_best
from reports.sources import report_acceptance

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "decoder" / "assets" / "bundled" / "acceptance-greedy.json"


@pytest.mark.parametrize("value", ["paper", None, PAPER_ACCEPTANCE])
def test_paper_none_and_the_preset_are_the_papers_curve(value):
    choice = resolve_acceptance(value)
    assert choice.model is PAPER_ACCEPTANCE and choice.curve is PAPER_ACCEPTANCE and choice.trees is None
    assert choice.label == PAPER_ACCEPTANCE.describe() == "acc(n) = 0.477 log2(n) (Medusa paper Appendix G.3 preset)"


@pytest.mark.parametrize("as_path", [str, Path])
def test_a_record_uses_the_model_closer_to_its_measurements(as_path):
    choice = resolve_acceptance(as_path(RECORD))
    log, heads = models_from_record(AcceptanceRecord.load(RECORD))
    used = closer_to_record(log, heads)
    assert type(choice.model) is type(used) and choice.model.error == used.error
    assert isinstance(choice.trees, HeadAccuracyAcceptance)  # the record's head accuracies shape trees
    assert isinstance(choice.log, LogAcceptance) and choice.log.error == log.error
    assert choice.label.startswith(f"{used.describe()} from {RECORD.name}; closer to the record than its ")
    assert choice.record == AcceptanceRecord.load(RECORD)


def test_a_model_from_python_is_used_as_is():
    log = LogAcceptance(1.0, 0.3, "mine")
    choice = resolve_acceptance(log)
    assert choice.model is log and choice.log is log and choice.trees is None and choice.label == log.describe()
    heads = HeadAccuracyAcceptance(np.array([[0.6, 0.1], [0.4, 0.1]]))
    assert resolve_acceptance(heads).model is heads and resolve_acceptance(heads).trees is heads

    def flat(n):
        return np.full(np.shape(n), 1.5)

    assert resolve_acceptance(flat).model is flat
    assert resolve_acceptance(choice) is choice


@pytest.mark.parametrize("value", [3, 0.5, ["paper"]])
def test_anything_else_is_a_clear_error(value):
    with pytest.raises(PerfkitError, match=r"acceptance must be a preset \(paper, paper-ln, eagle\), a decoder"):
        resolve_acceptance(value)


def test_plan_reads_acceptance_as_the_speedups_and_reports_do(tmp_path):
    assert plan("llama-7b", "a100", acceptance="paper").bands.equals(plan("llama-7b", "a100").bands)
    assert plan("llama-7b", "a100", acceptance=None).bands.equals(plan("llama-7b", "a100").bands)
    from_record = plan("llama-7b", "a100", acceptance=RECORD)
    assert from_record.acceptance == resolve_acceptance(RECORD).model.describe()
    report = report_acceptance(str(RECORD), "llama-7b")
    assert report.choice.label == resolve_acceptance(RECORD).label and report.record == AcceptanceRecord.load(RECORD)
    assert report_acceptance("paper", "llama-7b").choice.curve is PAPER_ACCEPTANCE
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"per_tree_size": [{"tree_size": 4}], "head_topk_accuracy": [[0.5]]}))
    with pytest.raises(PerfkitError, match=re.escape(f"{bad}: not a usable decoder.measure record")):
        plan("llama-7b", "a100", acceptance=bad)


def table(speedups: dict[tuple[int, int], float]) -> pd.DataFrame:
    rows = [dict(batch=b, seq_len=1024, tree_size=n, speedup=s) for (b, n), s in speedups.items()]
    return pd.DataFrame(rows).sample(frac=1, random_state=0)  # best is not simply the first row


def test_pick_best_takes_the_highest_speedup_and_the_smaller_tree_on_ties():
    t = table({(1, 1): 1.0, (1, 4): 1.8, (1, 8): 2.0, (1, 16): 2.0, (2, 1): 1.0, (2, 4): 1.0, (2, 8): 0.9})
    best = pick_best(t).set_index("batch")
    assert best.loc[1, "tree_size"] == 8 and best.loc[1, "speculate"]
    # a tree no better than plain decoding loses the tie: "do not speculate"
    assert best.loc[2, "tree_size"] == 1 and not best.loc[2, "speculate"] and best.loc[2, "speedup"] == 1.0
    assert set(pick_best(t).index) <= set(t.index)  # rows keep the table's index
    assert mark_best(t)["best"].sum() == 2 and (mark_best(t)[lambda x: x["best"]].index == pick_best(t).index).all()


def test_pick_best_only_among_eligible_rows():
    t = table({(1, 1): 1.0, (1, 4): 1.8, (1, 8): 2.0})
    best = pick_best(t, ["batch"], eligible=t["tree_size"] < 8)
    assert best["tree_size"].tolist() == [4]
    assert pick_best(t, ["batch"], eligible=t["tree_size"] == 1)["speculate"].tolist() == [False]


def test_every_best_tree_comes_from_pick_best():
    result = plan("llama-7b", ["a100", "h100"], batches=[1, 4, 16, 64, 256], prompt_len=2048)
    configs = result.configs
    best = pick_best(configs, ["device", "batch"], eligible=configs["fits"]).reset_index(drop=True)
    assert best["tree_size"].tolist() == result.bands["tree_size"].tolist()
    assert best["speculate"].tolist() == result.bands["speculate"].tolist()
    assert (result.bands["tree"] == np.where(best["speculate"], best["tree_size"].astype(str), "none")).all()
    fitting = configs[configs["fits"]].assign(seq_len=1024)
    sims = mark_best(fitting, ("device", "batch"))
    assert optima(sims)["tree_size"].tolist() == best["tree_size"].tolist()
    assert optima(sims)["speculate"].tolist() == best["speculate"].tolist()
    a100 = fitting[fitting["device"] == result.bands["device"].iloc[0]]
    assert best_sizes(a100)["tree_size"].tolist() == best["tree_size"].iloc[: len(best_sizes(a100))].tolist()


def test_an_acceptance_choice_is_one_type():
    assert simulations.AcceptanceChoice is AcceptanceChoice  # the figures import it from there


def test_plan_picks_the_best_tree_whose_kv_cache_fits():
    device = plan("llama-7b", "a100").devices.iloc[0]
    free_tokens = int((device.usable_gb - device.weights_gb - device.heads_gb) * 1e3 // device.kv_mb_per_token)
    # one sequence fits with 60 tokens to spare: trees above 61 tokens do not, though they would be faster
    result = plan("llama-7b", "a100", prompt_len=free_tokens - 256 - 60, batches=[1])
    configs = result.configs
    assert configs.loc[configs["speedup"].idxmax(), "tree_size"] > 61 and not configs["fits"].all()
    band = result.bands.iloc[0]
    assert band["tree_size"] == pick_best(configs, ["batch"], eligible=configs["fits"])["tree_size"].item() <= 61


EAGLE_RECORD = Path(__file__).resolve().parents[1] / "docs" / "results" / "data" / "acceptance-eagle-greedy.json"


@pytest.mark.parametrize("setting", ["eagle", str(EAGLE_RECORD)])
def test_the_medusa_heads_answers_refuse_eagles_acceptance(setting):
    from perfmodel.planning.capacity import plan
    from perfmodel.planning.schedule import speculation_schedule
    from perfmodel.planning.workload import Workload
    from perfmodel.serving.capacity import serve

    message = f"acceptance {setting} is of the eagle drafter, not of medusa"
    for call in (
        lambda: plan("llama-7b", "a100", acceptance=setting),
        lambda: speculation_schedule("llama-7b", "a100", acceptance=setting),
        lambda: serve("llama-7b", ["a100"], Workload(rate=1.0), acceptance=setting),
    ):
        with pytest.raises(PerfkitError, match=message):
            call()


def test_a_report_given_eagles_record_prices_eagle_with_it_and_the_heads_with_their_preset():
    from reports.sources import report_acceptance, report_drafters

    acceptance = report_acceptance(str(EAGLE_RECORD), "bundled")
    assert acceptance.choice.drafter == "medusa" and acceptance.record is None
    medusa, eagle, _ = report_drafters(acceptance, "bundled")
    assert eagle.choice.record is not None and eagle.choice.drafter == "eagle"
    assert medusa.choice.label == resolve_acceptance("paper").label
