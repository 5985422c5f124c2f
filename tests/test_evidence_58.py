"""Issue 58, item 1: each device's measured evidence is resolved once per command, held by its
Deployment, and read again only when the files behind it change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hw_specs import SPEC_DIR
from perfmodel.latency.gemm_grid import gemm_grid
from perfmodel.measured.aiconfigurator import shipped_stacks
from perfmodel.measured.evidence import as_evidence, device_evidence
from perfmodel.measured.store import MEASUREMENTS_DIR, user_measurements_dir
from perfmodel.planning.deployment import DeploymentChoices, resolve

ROOT = Path(__file__).resolve().parent.parent

# Runs a command in a fresh interpreter, counting every read of a spec, a provenance.json and a
# measured table (parquet) by path, and prints the counts as JSON on its last line.
COUNTING = """
import collections, contextlib, io, json, pathlib, runpy, sys
import pandas as pd
counts = collections.Counter()
read_text, read_parquet = pathlib.Path.read_text, pd.read_parquet
def counted_text(self, *a, **k):
    if self.suffix in (".yaml", ".json"):
        counts[str(self)] += 1
    return read_text(self, *a, **k)
def counted_parquet(path, *a, **k):
    counts[str(path)] += 1
    return read_parquet(path, *a, **k)
pathlib.Path.read_text, pd.read_parquet = counted_text, counted_parquet
module, sys.argv = sys.argv[1], sys.argv[1:]
try:
    with contextlib.redirect_stdout(io.StringIO()):
        runpy.run_module(module, run_name="__main__")
except SystemExit as exit:
    assert not exit.code, exit.code
print(json.dumps(counts))
"""


def loads(module: str, *args: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", COUNTING, module, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    "args",
    [
        ("--gpu", "h100", "h200", "b200", "--model", "llama-2-70b", "--tp", "auto"),
        # devices without GEMM measurements: every measured device lends its grid (transfer)
        ("--gpu", "a40", "rtx-4090", "--model", "llama-2-7b"),
    ],
    ids=["measured", "transferred"],
)
def test_one_plan_loads_each_spec_and_table_once(args):
    counts = loads("perfmodel.plan", *args)
    specs = {p: n for p, n in counts.items() if Path(p).parent == SPEC_DIR}
    provenance = {p: n for p, n in counts.items() if p.endswith("provenance.json")}
    tables = {p: n for p, n in counts.items() if p.endswith(".parquet")}
    assert len(specs) == len(list(SPEC_DIR.glob("*.yaml")))
    assert provenance and tables
    read_again = {p: n for p, n in {**specs, **provenance, **tables}.items() if n > 1}
    assert not read_again, f"read more than once: {read_again}"


def test_a_deployment_holds_its_devices_evidence_and_its_steps_use_it():
    h100, h200 = resolve("llama-2-7b", ["h100", "h200"], DeploymentChoices(latency="auto"))
    assert h100.view.evidence.key == "h100-sxm" and h200.view.evidence.key == "h200"
    source = h100.steps()["full"].shard_step.latency
    # the grid the step is priced by is the one kept on the deployment's evidence
    assert source.grid is gemm_grid(h100.view.evidence, source.grid.stack.stack, "fp16")
    assert any(what[0] == "gemm_grid" for what in h100.view.evidence._derived)
    # resolving again finds the same evidence: nothing is read or fitted twice
    (again,) = resolve("llama-2-7b", "h100-sxm")
    assert again.view.evidence is h100.view.evidence


def test_an_engine_stack_is_its_engine_and_version():
    stacks = {s.stack: s for s in as_evidence("h100").stacks}
    vllm = stacks["vllm-0.24.0"]
    assert vllm.engine == "vllm" and vllm.engine.name == "VLLM" and vllm.version == "0.24.0"
    assert {"gemm", "generation_attention"} <= vllm.tables and vllm.has("gemm") and not vllm.has("all_reduce")


def copy_stack(device: str, stack: str) -> Path:
    source = next(MEASUREMENTS_DIR.glob(f"{device}/*/{stack}"))
    target = user_measurements_dir() / device / source.parent.name / stack
    shutil.copytree(source, target)
    return target


def test_a_reimported_stack_is_read_again(monkeypatch):
    folder = copy_stack("h200", "nccl-2.29.2")
    before = as_evidence("h200")
    assert [s for s in before.stacks if s.stack == "nccl-2.29.2"][0].folder == folder  # the user's copy
    assert as_evidence("h200") is before
    provenance = json.loads((folder / "provenance.json").read_text())
    (folder / "provenance.json").write_text(json.dumps({**provenance, "package": "aiconfigurator-core 9.9"}))
    stat = (folder / "provenance.json").stat()
    os.utime(folder / "provenance.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    after = as_evidence("h200")
    assert after is not before
    assert [s.package for s in after.stacks if s.stack == "nccl-2.29.2"] == ["aiconfigurator-core 9.9"]


def test_a_stack_of_an_unknown_engine_is_refused_naming_the_file():
    folder = copy_stack("h100-sxm", "vllm-0.24.0")
    provenance = json.loads((folder / "provenance.json").read_text())
    (folder / "provenance.json").write_text(json.dumps({**provenance, "engine": "lmdeploy"}))
    (stack,) = [s for s in shipped_stacks("h100-sxm") if s.folder == folder]
    with pytest.raises(Exception, match=r"provenance.json: engine 'lmdeploy' is none of vllm, sglang"):
        _ = stack.engine


def test_evidence_of_an_edited_spec_is_its_own():
    spec = as_evidence("h100").spec
    faster = device_evidence(type(spec)(**{**spec.__dict__, "memory_bandwidth_gb_s": 2 * spec.memory_bandwidth_gb_s}))
    assert faster is not as_evidence("h100") and faster.spec.memory_bandwidth_gb_s == 2 * spec.memory_bandwidth_gb_s
    assert [s.stack for s in faster.stacks] == [s.stack for s in as_evidence("h100").stacks]
