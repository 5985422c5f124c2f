"""Issue 59, item 3 in the report: a drafter's best chain per batch from its measured
per-position acceptance, on the page's own deployment, and where speculation stops paying."""

from __future__ import annotations

import re

import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.planning.deployment import resolve
from reports.__main__ import main
from reports.chain_section import chain_section, measured_chains
from reports.html import Page
from reports.report import BuildConfig


def page_text(config: BuildConfig, model: str, device: str) -> tuple[str, object]:
    (deployment,) = resolve(model, device)
    chains = measured_chains(config, deployment, "full", 640)
    page = Page("t")
    chain_section(page, chains)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page.render())), chains


def test_the_page_shows_the_best_chain_per_batch_and_where_it_stops_paying():
    rates = (0.2,)
    text, chains = page_text(BuildConfig("llama-3-8b", drafter="eagle3", position_rates=rates), "llama-3-8b", "h100")
    rows = chains.rows.set_index("batch")
    assert "Measured chain: EAGLE-3" in text and "--drafter eagle3 --position-rates 0.2 --context 640" in text
    # a poor chain pays at batch 1 and is off by batch 256 on an H100 (the step grows compute-bound)
    assert rows.loc[1, "speculate"] and not rows.loc[256, "speculate"]
    stop = int(rows.index[~rows["speculate"]].min())
    assert f"stops paying from batch {stop} on" in text
    assert f"1 1 {rows.loc[1, 'acceleration']:.2f}" in text and "256 off 1.00" in text
    assert (
        f"| 1 {rows.loc[1, 'chain']} " in text.replace(" ", " ").replace("  ", " ") or str(rows.loc[1, "chain"]) in text
    )


def test_no_rates_no_section_and_a_drafter_without_rates_is_one_line(tmp_path):
    assert measured_chains(BuildConfig("llama-3-8b"), None, "full", 640) is None
    with pytest.raises(PerfkitError, match="--drafter eagle3: the page shows its best chain"):
        main(["build", "--gpu", "h100", "--model", "llama-3-8b", "--drafter", "eagle3", "--out", str(tmp_path / "a")])
    with pytest.raises(PerfkitError, match="name it with --drafter"):
        main(
            ["build", "--gpu", "h100", "--model", "llama-3-8b", "--position-rates", "0.5", "--out", str(tmp_path / "b")]
        )
