"""What every engine export of a speculation schedule shares: where each drafter's weights are
loaded from, the bands grouped by drafter and tree (one file each), the file names, and the
provenance lines a file carries.
"""

from __future__ import annotations

from collections.abc import Mapping

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.planning.drafters import DRAFTERS, KIND_NAMES
from perfmodel.planning.medusa_setting import MedusaSetting
from perfmodel.planning.schedule_format import OFF, ScheduleBand, SpeculationSchedule

Weights = dict[str, str]  # drafter -> where an engine loads its weights from
# The drafters an engine loads weights of their own for: an MTP module is the target checkpoint's
# own, n-gram lookup has none.
LOADS_WEIGHTS = (DrafterKind.MEDUSA, DrafterKind.EAGLE, DrafterKind.DRAFT, DrafterKind.EAGLE3)


def drafter_weights(schedule: SpeculationSchedule, given: str | Mapping[str, str] | None = None) -> Weights:
    """Where the engines load each drafter's weights from (the Medusa heads, the EAGLE or
    EAGLE-3 head, the draft model): given, else a placeholder `<model>-<drafter>` to replace. A
    str is the weights of the schedule's one drafter; a best-drafter schedule names them per drafter."""
    named = (*DRAFTERS, *(d for d in LOADS_WEIGHTS if d == schedule.drafter and d not in DRAFTERS))
    if isinstance(given, str):
        if schedule.drafter not in LOADS_WEIGHTS and schedule.drafter in (DrafterKind.MTP, DrafterKind.NGRAM):
            raise PerfkitError(
                f"--heads {given}: {KIND_NAMES[schedule.drafter]} loads no weights of its own (an MTP module is the "
                "target checkpoint's, n-gram lookup has none): leave --heads out"
            )
        if schedule.drafter not in LOADS_WEIGHTS:
            raise PerfkitError(
                f"a {schedule.drafter}-drafter schedule loads one set of weights per drafter: give DRAFTER=PATH for "
                f"each of {', '.join(DRAFTERS)}, not {given!r}"
            )
        given = {schedule.drafter: given}
    given = dict(given or {})
    unknown = [name for name in given if name not in named]
    if unknown:
        raise PerfkitError(f"weights of unknown drafter {unknown[0]!r}; drafters: {', '.join(named)}")
    return {name: given.get(name) or f"{schedule.model}-{name}" for name in named}


def by_tree(schedule: SpeculationSchedule) -> dict[tuple[str, int], list[ScheduleBand]]:
    """The bands each drafter and tree size runs in, off first, then by size (and drafter)."""
    out: dict[tuple[str, int], list[ScheduleBand]] = {}
    for band in sorted(schedule.bands, key=lambda b: (b.tree_size, (OFF, *DrafterKind).index(b.drafter))):
        out.setdefault((band.drafter, band.tree_size), []).append(band)
    return out


# A band's tree in words, per drafter (str.format over the band's fields), its tokens per step beside it.
TREE_WORDS = {
    "medusa": "a tree of {tree_size} tokens ({acceptance:.2f} tokens/step)",
    "eagle": "an EAGLE tree of {tree_size} tokens, {depth} draft passes over the top-{top_k} ({acceptance:.2f} "
    "tokens/step)",
    "draft": "a draft model's chain of gamma = {depth} tokens ({acceptance:.2f} tokens/step)",
    "eagle3": "an EAGLE-3 chain of {depth} drafts ({acceptance:.2f} tokens/step)",
    "mtp": "an MTP chain of {depth} drafts, the module run once per draft ({acceptance:.2f} tokens/step)",
    "ngram": "an n-gram lookup chain of {depth} drafts ({acceptance:.2f} tokens/step)",
}
# Each export file's name: tree-N (Medusa), eagle-N (an EAGLE tree of N tokens), draft-gamma-G, a measured
# drafter's chain-K, or off.
FILE_STEMS = {
    "medusa": "tree-{tree_size}",
    "eagle": "eagle-{tree_size}",
    "draft": "draft-gamma-{depth}",
    "eagle3": "eagle3-chain-{depth}",
    "mtp": "mtp-chain-{depth}",
    "ngram": "ngram-chain-{depth}",
    OFF: "off",
}


def provenance(schedule: SpeculationSchedule, bands: list[ScheduleBand]) -> list[str]:
    """What one export file's numbers rest on, as comment lines."""
    band = bands[0]
    what = (
        TREE_WORDS[band.drafter].format(**vars(band))
        if band.speculate
        else "off: plain decoding"
        + (f" ({schedule.setting()})" if schedule.medusa == MedusaSetting.OFF else ", no tree beats it")
    )
    gains = "; ".join(f"{b.label()} ({b.speedup:.2f}x)" for b in bands)
    return [
        f"medusa-perfkit speculation schedule: {schedule.model} on {schedule.device}, tp={schedule.tp}, "
        f"{schedule.dtype}, {schedule.setting()}",
        f"{what}, predicted speedup over plain decoding in: {gains}",
        f"step times rest on: {'/'.join(dict.fromkeys(b.evidence for b in bands))} ({schedule.latency})",
        f"acceptance: {schedule.acceptance}",
    ]


def commented(lines: list[str], body: str) -> str:
    return "".join(f"# {line}\n" for line in lines) + body


def file_stem(band: ScheduleBand) -> str:
    return FILE_STEMS[band.drafter].format(**vars(band))
