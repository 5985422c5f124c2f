"""Issue 22, items 1, 5 (simulation c past the model's context) and 6 (one default dtype).

Item 1: the paper's acc(n) = 0.477 log(n) is read as log2, the reading its own measurements
support; the natural-log reading stays available as "paper-ln". docs/acceptance.md gives
the evidence; its numbers are the block `evidence_block()` writes (run this file to print it).
"""

import contextlib
import functools
import io
import math
import re
import sys
from pathlib import Path

import pytest

import reports.commands.plan as plan_cli
from perfmodel.acceptance.rates import PAPER_ACCEPTANCE, resolve_acceptance
from perfmodel.base.dtypes import default_dtype
from perfmodel.base.errors import PerfkitError
from perfmodel.measured.device_view import resolve_devices
from perfmodel.models.config import load_model
from perfmodel.planning.capacity import plan
from perfmodel.planning.simulations import device_table, loses_from, optima
from reports.commands import speedup as speedup_cli
from reports.sources import report_acceptance
from tests.conftest import deploy

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "acceptance.md"
BEGIN, END = "<!-- evidence: begin (tests/test_defects_acceptance.py) -->", "<!-- evidence: end -->"


def ln_reading():
    """The paper's slope read as a natural log, by its name (as a command line gives it)."""
    return resolve_acceptance("paper-ln").model


def run_cli(main, argv) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue()


# ----------------------------------------------------------------------------- item 1


def test_the_paper_preset_is_log2_and_the_ln_reading_is_kept_by_name():
    paper, ln = resolve_acceptance("paper"), resolve_acceptance("paper-ln")
    assert paper.model(64) == pytest.approx(0.477 * 6) and round(float(paper.model(64)), 2) == 2.86
    assert ln.model(64) == pytest.approx(0.477 * math.log(64)) and round(float(ln.model(64)), 2) == 1.98
    assert resolve_acceptance(None).model is paper.model
    assert paper.label == "acc(n) = 0.477 log2(n) (Medusa paper Appendix G.3 preset)"
    assert ln.label.startswith("acc(n) = 0.477 ln(n) ")


def test_the_clamp_moves_with_the_base():
    # held at one token per step where 0.477 log2 n < 1: n < 2^(1/0.477) = 4.28 (ln: e^(1/0.477) = 8.14)
    assert PAPER_ACCEPTANCE.clamped_below() == pytest.approx(2 ** (1 / 0.477))
    assert PAPER_ACCEPTANCE(4) == 1.0 and PAPER_ACCEPTANCE(5) > 1.0
    assert ln_reading().clamped_below() == pytest.approx(math.exp(1 / 0.477))


def test_speedup_prints_the_papers_numbers_at_64_and_b_still_pays_at_batch_32(tmp_path):
    """The issue's acceptance check, through the command."""
    out = run_cli(
        speedup_cli.main,
        ["--gpu", "a100", "--model", "llama-7b", "--step", "paper", "--out", str(tmp_path), "--jobs", "1"],
    )
    assert "paper step: tree of 64 tokens, 2.86 tokens/step at" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("paper step: b=1 "))
    at_32 = re.search(r"b=32 n=(\d+) ([\d.]+)x", line)
    assert at_32 and float(at_32.group(2)) > 1.0, line


def test_every_command_takes_paper_ln_by_name(tmp_path):
    assert plan("llama-7b", "a100", acceptance="paper-ln").acceptance == ln_reading().describe()
    assert report_acceptance("paper-ln", "llama-7b").choice.model is ln_reading()
    out = run_cli(
        speedup_cli.main,
        ["--gpu", "a100", "--step", "paper", "--acceptance", "paper-ln", "--out", str(tmp_path), "--jobs", "1"],
    )
    assert "paper step: tree of 64 tokens, 1.98 tokens/step at" in out


def test_an_unknown_preset_names_the_presets():
    with pytest.raises(PerfkitError, match=r"paper-log2: no such file; .*preset \(paper, paper-ln, eagle\)"):
        resolve_acceptance("paper-log2")


@functools.cache
def evidence() -> dict:
    """The numbers docs/acceptance.md quotes, from the code: A100 (a100-pcie), llama-7b, fp16."""
    view = resolve_devices(["a100"])[0]
    model = load_model("llama-7b")
    found = {"device": view.spec.key}
    for latency in ("auto", "datasheet"):
        best = {}
        for name in ("paper-ln", "paper"):
            choice = resolve_acceptance(name)
            table = device_table(deploy(view, model, "fp16", latency), ("paper", "full"), choice)
            found[f"label {latency}"] = table["latency_model"].iloc[0]
            best[name] = rows = optima(table)
            for step in ("paper", "full"):
                a = rows[(rows["simulation"] == "a") & (rows["step"] == step)].iloc[0]
                b = rows[(rows["simulation"] == "b") & (rows["step"] == step)]
                lost = loses_from(b, "batch")
                paying = b.loc[b["speculate"], "batch"]
                found[latency, name, step] = (
                    f"n={a.tree_size}, {a.acceptance:.2f} tokens/step, {a.speedup:.2f}x",
                    f"to batch {paying.max()}; not from batch {lost}" if lost else "at every batch",
                )
        key = ["simulation", "step", "batch", "seq_len"]
        both = best["paper"].merge(best["paper-ln"], on=key, suffixes=("", "_ln"))
        both = both[both["speculate"] & both["speculate_ln"]]
        found[latency, "same optimum"] = (int((both["tree_size"] == both["tree_size_ln"]).sum()), len(both))
    return found


def evidence_block() -> str:
    e = evidence()
    ln, log2 = ln_reading(), PAPER_ACCEPTANCE
    lines = [
        BEGIN,
        f"Device {e['device']}, llama-7b, fp16, s=1024.",
        "",
        "| | paper-ln: 0.477 ln(n) | paper: 0.477 log2(n) |",
        "|---|---|---|",
        f"| tokens/step at n=64 | {ln(64):.2f} | {log2(64):.2f} |",
        f"| held at 1 token/step below n = | {ln.clamped_below():.2f} | {log2.clamped_below():.2f} |",
    ]
    for latency in ("auto", "datasheet"):
        for step in ("paper", "full"):
            cells = [e[latency, name, step] for name in ("paper-ln", "paper")]
            lines.append(f"| ({latency} latency, {step} step) (a) b=1: best | {cells[0][0]} | {cells[1][0]} |")
            lines.append(f"| ({latency} latency, {step} step) (b) trees pay | {cells[0][1]} | {cells[1][1]} |")
    lines.append("")
    for latency in ("auto", "datasheet"):
        same, settings = e[latency, "same optimum"]
        lines.append(
            f"- {latency} latency ({e[f'label {latency}']}): the best tree is the same under both readings in "
            f"{same} of the {settings} settings of (a), (b) and (c) where both speculate."
        )
    lines.append(END)
    return "\n".join(lines)


def test_the_docs_numbers_are_the_codes():
    text = DOC.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, f"{DOC} lost its evidence block"
    shown = text[text.index(BEGIN) : text.index(END) + len(END)]
    expected = evidence_block()
    assert shown == expected, f"regenerate with python {Path(__file__).relative_to(ROOT)}:\n{expected}"


def prose_claims() -> list[str]:
    """The sentences of docs/acceptance.md outside the block that quote the code's numbers."""
    e = evidence()
    ln, log2 = ln_reading(), PAPER_ACCEPTANCE
    ln_lost = re.search(r"not from batch (\d+)", e["auto", "paper-ln", "paper"][1]).group(1)
    log2_paid, log2_lost = re.search(r"to batch (\d+); not from batch (\d+)", e["auto", "paper", "paper"][1]).groups()
    datasheet_best = re.search(r"n=(\d+)", e["datasheet", "paper", "paper"][0]).group(1)
    return [
        f"Read as ln, the curve gives {ln(64):.2f} at n = 64",
        f"Read as log2 it gives {log2(64):.2f}",
        f"With ln, trees stop paying from batch {ln_lost} on the A100",
        f"With log2 they pay through batch {log2_paid} and stop from {log2_lost}",
        f"by 1/ln 2 = {1 / math.log(2):.2f}",
        f"n = 2^(1/0.477) = {log2.clamped_below():.2f} (ln: below e^(1/0.477) = {ln.clamped_below():.2f})",
        f"puts the b=1 optimum at {datasheet_best} tokens",
        f"64-token tree at {log2(64):.2f} tokens/step and trees that pay through batch {log2_paid}",
        f"the second {ln(64):.2f} tokens/step and trees that stop paying from batch {ln_lost}",
    ]


def test_the_docs_prose_quotes_the_codes_numbers():
    text = " ".join(DOC.read_text(encoding="utf-8").split())  # line breaks are the writer's
    missing = [claim for claim in prose_claims() if claim not in text]
    assert not missing, f"{DOC} no longer says what the code computes: {missing}"


def test_the_optimum_does_not_depend_on_the_base():
    e = evidence()
    for latency in ("auto", "datasheet"):
        same, settings = e[latency, "same optimum"]
        assert settings > 0 and same == settings


# ----------------------------------------------------------------------------- item 5


def test_simulation_c_marks_the_contexts_the_model_was_not_trained_for(tmp_path):
    view = resolve_devices(["a100"])[0]
    table = device_table(
        deploy(view, load_model("llama-7b"), "fp16", "datasheet"), ("paper",), resolve_acceptance("paper")
    )
    assert (table["max_context"] == 2048).all()
    assert table["beyond_context"].equals(table["seq_len"] > 2048)
    assert sorted(set(table.loc[table["beyond_context"], "simulation"])) == ["c"]
    assert set(table["seq_len"]) >= {4096, 8192}  # kept, as the paper's simulation (c) has them
    out = run_cli(
        speedup_cli.main,
        ["--gpu", "a100", "--model", "llama-7b", "--step", "paper", "--latency", "datasheet"]
        + ["--out", str(tmp_path), "--jobs", "1"],
    )
    assert "s=2048 n=" in out and "s=4096* n=" in out and "s=8192* n=" in out
    assert "* s=4096, 8192: beyond llama-7b's 2048-token context" in out


def test_a_models_context_comes_from_its_family_or_its_config(tmp_path):
    assert load_model("llama-2-7b").max_context == 4096 and load_model("llama-3-8b").max_context == 8192
    assert load_model("mistral-7b").max_context == 32768
    config = tmp_path / "config.json"
    config.write_text(
        '{"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, '
        '"num_attention_heads": 4, "max_position_embeddings": 512}'
    )
    model = load_model(config)
    assert model.max_context == 512
    view = resolve_devices(["a100"])[0]
    table = device_table(deploy(view, model, "fp16", "datasheet"), ("full",), resolve_acceptance("paper"))
    assert table["beyond_context"].equals(table["seq_len"] > 512)


# ----------------------------------------------------------------------------- item 6


def test_plan_and_speedup_default_to_the_same_dtype_on_a_cpu(tmp_path):
    planned = run_cli(plan_cli.main, ["--gpu", "cpu", "--model", "bundled"])
    assert "\nbundled (fp32): " in planned
    speedup = run_cli(
        speedup_cli.main,
        ["--gpu", "cpu", "--model", "bundled", "--step", "paper", "--out", str(tmp_path), "--jobs", "1"],
    )
    assert ", bundled, fp32: predicted" in speedup
    assert "\nllama-7b (fp16): " in run_cli(plan_cli.main, ["--gpu", "a100", "--model", "llama-7b"])


def test_one_rule_decides_a_default_dtype():
    cpu, gpu = resolve_devices(["cpu", "a100"])
    assert [default_dtype(x) for x in (cpu, gpu, "cpu", "cuda", cpu.spec.key, "a100")] == ["fp32", "fp16"] * 3
    assert plan("bundled", ["cpu", "a100"]).dtype == "fp32/fp16"  # each device its own default


if __name__ == "__main__":
    sys.stdout.write(evidence_block() + "\n")
