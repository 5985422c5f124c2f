"""The house rules the code keeps (issue 39): small modules, short signatures in the analytic
core, and a report that looks its deployment up once (perfmodel.planning.deployment.resolve)."""

from __future__ import annotations

import ast
import collections
import sys
from pathlib import Path

import reports.build as report_build
from reports.__main__ import main as reports_main

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("perfmodel", "profilers", "decoder", "reports")
MAX_MODULE_LINES = 400
MAX_PARAMETERS = 8  # in perfmodel: more is a settings object (a dataclass) waiting to be named


def sources(*layers: str) -> list[Path]:
    return sorted(p for layer in layers for p in (ROOT / layer).rglob("*.py"))


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in sources(*LAYERS) if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by job): {long}"


def wide_functions(*layers: str) -> dict[str, int]:
    wide = {}
    for path in sources(*layers):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.arg not in ("self", "cls")]
                names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
                if len(names) > MAX_PARAMETERS:
                    wide[f"{path.relative_to(ROOT)} {node.name}"] = len(names)
    return wide


def test_no_function_anywhere_takes_more_than_8_parameters():
    # More is a settings dataclass waiting to be named (issue 58 named the last ten).
    wide = wide_functions(*LAYERS)
    assert not wide, f"functions over {MAX_PARAMETERS} parameters: {wide}"


# What looks a model, device or latency source up, module by module.
LOOKUPS = {
    "perfmodel/models/config.py": {"load_model"},
    "perfmodel/hardware/specs.py": {"find_spec", "resolve_spec", "load_all_specs", "load_spec_file"},
    "perfmodel/measured/device_view.py": {"resolve_view", "resolve_devices", "gpu_view", "cpu_view"},
    "perfmodel/latency/source.py": {"view_latency", "latency_source", "decoder_latency"},
}


def counted_lookups(monkeypatch, argv: list[str]) -> tuple[collections.Counter, collections.Counter]:
    """Lookups made by a whole report build, and by its answer (reports.answer.gather) alone."""
    watched = {(str(ROOT / path), name) for path, names in LOOKUPS.items() for name in names}
    build, gather = collections.Counter(), collections.Counter()
    inside = []

    def profile(frame, event, arg):
        if event == "call" and (frame.f_code.co_filename, frame.f_code.co_name) in watched:
            (gather if inside else build)[frame.f_code.co_name] += 1

    real = report_build.gather

    def gather_traced(*args, **kwargs):
        inside.append(True)
        try:
            return real(*args, **kwargs)
        finally:
            inside.pop()

    monkeypatch.setattr(report_build, "gather", gather_traced)
    sys.setprofile(profile)
    try:
        assert reports_main(["build", *argv]) == 0
    finally:
        sys.setprofile(None)
    return build, gather


def test_a_report_resolves_its_deployment_once_and_its_answer_looks_nothing_up(monkeypatch, tmp_path):
    build, gather = counted_lookups(monkeypatch, ["--gpu", "a100", "--model", "llama-7b", "--out", str(tmp_path)])
    assert not gather, f"the answer looked up {dict(gather)}: it takes the build's deployment"
    # the model and the device once (reports.build.load_inputs), the view handed to resolve()
    assert build["load_model"] == 1 and build["resolve_view"] == 1 and build["resolve_devices"] == 1


# The names of the typed modes (launch regime, step flavour, latency mode and stack choice,
# drafter, Medusa setting, phase, tree family and kind, timer mode, a row's provenance).
MODE_NAMES = {
    *("eager", "static", "graph", "compiled", "full", "traced", "paper", "reference", "medusa", "eagle", "draft"),
    *("best", "all", "auto", "on", "off", "measured", "predicted", "calibrated", "grid", "borrowed", "datasheet"),
    *("prefill", "decode", "tree", "chain", "plain", "dynamic", "events"),
}
# Where text from a command line becomes a mode: parsers, and the decoder's commands reading
# --tree (a tree name or auto); the plots' "best" is a column's name.
PARSING_EDGE = (
    "perfmodel/cli/",
    "decoder/measure.py",
    "decoder/generate.py",
    "perfmodel/planning/engine_exports.py",
    "reports/plotting.py",
)


def test_modes_are_compared_as_members_outside_the_parsing_edge():
    found = []
    for path in sources(*LAYERS):
        name = str(path.relative_to(ROOT))
        if name.startswith(PARSING_EDGE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            if not any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
                continue
            texts = []
            for side in (node.left, *node.comparators):
                elements = side.elts if isinstance(side, (ast.Tuple, ast.Set, ast.List)) else [side]
                texts += [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if MODE_NAMES & set(texts):
                found.append(f"{name}:{node.lineno} {ast.unparse(node)[:80]}")
    assert not found, f"modes compared as text (compare the enum's members): {found}"
