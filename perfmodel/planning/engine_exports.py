"""A speculation schedule (perfmodel.planning.schedule) in the serving engines' own formats, as
Python data and as files, one file per drafter and tree the schedule runs (its comment, where
the format takes one, lists the bands it runs in):

- vLLM (docs.vllm.ai, features/speculative_decoding): vLLM's Medusa drafts one token per head,
  the top-1 of heads 1..K (vllm/v1/spec_decode/medusa.py; K sets the number of heads it uses),
  and its EAGLE one token per draft pass by default, so its export is made from a `chain`
  schedule. Per chain, the `--speculative-config` JSON {method: medusa, model: the heads,
  num_speculative_tokens: K, speculative_token_tree: the chain's paths}, {method: eagle, model:
  the EAGLE head, num_speculative_tokens: K} or {method: draft_model, model: the draft model,
  num_speculative_tokens: gamma}; and the dynamic-speculation table
  `num_speculative_tokens_per_batch_size`
  (features/speculative_decoding/dynamic_speculative_decoding): entries [bs_lo, bs_hi, K], or
  [bs_lo, bs_hi, ctx_lo, ctx_hi, K] on a rectangular (batch x context) grid where vLLM reads
  context ranges (vllm/v1/spec_decode/dynamic/utils.py); K = 0 is off. One batch-only table
  per context band too, for versions that read batch ranges only. The table switches K, not
  the drafter: a schedule whose bands run several drafters gets no table (vllm_note).
- SGLang (docs.sglang.io, advanced_features/speculative_decoding): the server arguments of a
  draft tree of the band's budget: `--speculative-num-steps` = depth, `--speculative-eagle-topk`
  = top-k, `--speculative-num-draft-tokens` = tokens verified, root included. EAGLE's band runs
  SGLang's EAGLE (EAGLE-2's tree) with its head as `--speculative-draft-model-path`, a draft
  model's STANDALONE (top-k 1: a chain of gamma). SGLang has no Medusa drafter: a Medusa
  band's arguments size its EAGLE tree like the schedule's; no arguments = off.
- TensorRT-LLM (nvidia.github.io/TensorRT-LLM, the LLM API's decoding configs): the
  `trtllm-serve --extra_llm_api_options` YAML {speculative_config: {decoding_type: Medusa,
  max_draft_len, num_medusa_heads, medusa_choices}} (MedusaDecodingConfig), {decoding_type:
  Eagle, ...} with EAGLE-2's dynamic tree (EagleDecodingConfig), or {decoding_type: DraftTarget,
  max_draft_len: gamma, speculative_model} (DraftTargetDecodingConfig); an empty mapping = off.
- json: the schedule's own JSON (SpeculationSchedule.to_json), which says what every number
  rests on. Engine JSON carries the engine's own keys only (a config is checked against its
  fields); the YAML and SGLang files say it in comments.

Where an engine loads a drafter's weights from (the Medusa heads, the EAGLE head, the draft
model) is given per drafter, else a placeholder `<model>-<drafter>` to replace
(drafter_weights).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from perfmodel.base.errors import PerfkitError
from perfmodel.planning.drafters import DRAFTER_NAMES, DRAFTERS
from perfmodel.planning.schedule_format import OFF, ScheduleBand, SpeculationSchedule, compact_json

ENGINES = ("vllm", "sglang", "tensorrt-llm", "json")


def check_engines(engines) -> tuple[str, ...]:
    """The engines asked for, `all` for every one; anything else is one line naming it."""
    engines = tuple(engines)
    if "all" in engines:
        return ENGINES
    unknown = [e for e in engines if e not in ENGINES]
    if unknown or not engines:
        named = ", ".join(map(repr, unknown)) or "(none)"
        raise PerfkitError(f"unknown engine {named}; choose from: {', '.join(ENGINES)}, all")
    return tuple(dict.fromkeys(engines))


Weights = dict[str, str]  # drafter -> where an engine loads its weights from


def drafter_weights(schedule: SpeculationSchedule, given: str | Mapping[str, str] | None = None) -> Weights:
    """Where the engines load each drafter's weights from (the Medusa heads, the EAGLE head, the
    draft model): given, else a placeholder `<model>-<drafter>` to replace. A str is the
    weights of the schedule's one drafter; a best-drafter schedule names them per drafter."""
    if isinstance(given, str):
        if schedule.drafter not in DRAFTERS:
            raise PerfkitError(
                f"a {schedule.drafter}-drafter schedule loads one set of weights per drafter: give DRAFTER=PATH for "
                f"each of {', '.join(DRAFTERS)}, not {given!r}"
            )
        given = {schedule.drafter: given}
    given = dict(given or {})
    unknown = [name for name in given if name not in DRAFTERS]
    if unknown:
        raise PerfkitError(f"weights of unknown drafter {unknown[0]!r}; drafters: {', '.join(DRAFTERS)}")
    return {name: given.get(name) or f"{schedule.model}-{name}" for name in DRAFTERS}


def by_tree(schedule: SpeculationSchedule) -> dict[tuple[str, int], list[ScheduleBand]]:
    """The bands each drafter and tree size runs in, off first, then by size (and drafter)."""
    out: dict[tuple[str, int], list[ScheduleBand]] = {}
    for band in sorted(schedule.bands, key=lambda b: (b.tree_size, (OFF, *DRAFTERS).index(b.drafter))):
        out.setdefault((band.drafter, band.tree_size), []).append(band)
    return out


# A band's tree in words, per drafter (str.format over the band's fields), its tokens per step beside it.
TREE_WORDS = {
    "medusa": "a tree of {tree_size} tokens ({acceptance:.2f} tokens/step)",
    "eagle": "an EAGLE tree of {tree_size} tokens, {depth} draft passes over the top-{top_k} ({acceptance:.2f} "
    "tokens/step)",
    "draft": "a draft model's chain of gamma = {depth} tokens ({acceptance:.2f} tokens/step)",
}
# Each export file's name: tree-N (Medusa), eagle-N (an EAGLE tree of N tokens), draft-gamma-G, or off.
FILE_STEMS = {"medusa": "tree-{tree_size}", "eagle": "eagle-{tree_size}", "draft": "draft-gamma-{depth}", OFF: "off"}


def provenance(schedule: SpeculationSchedule, bands: list[ScheduleBand]) -> list[str]:
    """What one export file's numbers rest on, as comment lines."""
    band = bands[0]
    what = (
        TREE_WORDS[band.drafter].format(**vars(band))
        if band.speculate
        else "off: plain decoding" + (f" ({schedule.setting()})" if schedule.medusa == "off" else ", no tree beats it")
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


# ----------------------------------------------------------------------------- vLLM

# SpeculativeConfig's `method` of each drafter:
# medusa https://docs.vllm.ai/en/latest/features/speculative_decoding/ (MedusaProposer),
# eagle https://docs.vllm.ai/en/latest/features/speculative_decoding/eagle/,
# draft_model https://docs.vllm.ai/en/latest/features/speculative_decoding/draft_model/
VLLM_METHODS = {"medusa": "medusa", "eagle": "eagle", "draft": "draft_model"}


def vllm_tree(paths) -> str:
    """vLLM's speculative_token_tree: the paths as a Python literal of tuples, breadth first."""
    return str([tuple(p) for p in sorted(paths, key=lambda p: (len(p), p))])


def check_vllm(schedule: SpeculationSchedule) -> None:
    """vLLM drafts chains: its Medusa one token per head, at most the model's heads; its EAGLE
    one token per draft pass (top-1); a draft model its gamma. Refuse any other tree."""
    for band in schedule.bands:
        if band.drafter == "medusa" and (not band.chain or band.draft_tokens > schedule.medusa_heads):
            raise PerfkitError(
                f"vLLM's Medusa drafts one token per head (a chain of at most {schedule.medusa_heads}); the tree of "
                f"{band.tree_size} tokens at {band.label()} is not one: export vLLM from a chain schedule "
                "(speculation_schedule(..., family='chain'))"
            )
        if band.drafter == "eagle" and not band.chain:
            raise PerfkitError(
                f"vLLM's EAGLE drafts one token per pass (top-1, a chain); the EAGLE tree of {band.tree_size} tokens "
                f"(top-{band.top_k}) at {band.label()} is not one: export vLLM from a chain schedule "
                "(speculation_schedule(..., family='chain'))"
            )


def vllm_band_config(band: ScheduleBand, weights: Weights) -> dict | None:
    """The --speculative-config of one band's chain, or None (off: no speculative config)."""
    if not band.speculate:
        return None
    config = {
        "method": VLLM_METHODS[band.drafter],
        "model": weights[band.drafter],
        "num_speculative_tokens": band.draft_tokens,
    }
    if band.drafter == "medusa":
        config["speculative_token_tree"] = vllm_tree(band.paths)
    return config


@dataclass(frozen=True)
class KGrid:
    """The schedule as a rectangular (batch x context) grid of K = draft tokens (0 = off), with
    neighbouring rows and columns of equal K merged."""

    batches: list[tuple[int, int]]
    contexts: list[tuple[int, int]]
    k: np.ndarray  # (batches, contexts)


def k_grid(schedule: SpeculationSchedule) -> KGrid:
    batch_edges = sorted({b.batch_min for b in schedule.bands})
    context_edges = sorted({b.context_min for b in schedule.bands})
    k = np.array([[schedule.band(b, c).draft_tokens for c in context_edges] for b in batch_edges], dtype=np.int64)
    batch_ranges, k = merged(spans(batch_edges, max(b.batch_max for b in schedule.bands)), k)
    context_ranges, kt = merged(spans(context_edges, max(b.context_max for b in schedule.bands)), k.T)
    return KGrid(batch_ranges, context_ranges, kt.T)


def spans(edges: list[int], last: int) -> list[tuple[int, int]]:
    return [(lo, hi - 1) for lo, hi in zip(edges, edges[1:])] + [(edges[-1], last)]


def merged(ranges: list[tuple[int, int]], rows: np.ndarray) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Neighbouring ranges whose rows are equal, as one range."""
    keep_ranges, keep_rows = [ranges[0]], [rows[0]]
    for span, row in zip(ranges[1:], rows[1:]):
        if np.array_equal(row, keep_rows[-1]):
            keep_ranges[-1] = (keep_ranges[-1][0], span[1])
        else:
            keep_ranges.append(span)
            keep_rows.append(row)
    return keep_ranges, np.array(keep_rows)


def vllm_note(schedule: SpeculationSchedule) -> str | None:
    """Why vLLM gets no dynamic-speculation table, where its bands run several drafters."""
    if len(schedule.drafters) < 2:
        return None
    names = ", ".join(DRAFTER_NAMES[d] for d in schedule.drafters)
    return (
        f"vLLM loads one drafter per server and its dynamic table switches K, not the drafter: this schedule's "
        f"bands run {names}, so vLLM gets one fixed config per band and no dynamic table"
    )


def vllm_dynamic_config(schedule: SpeculationSchedule, weights: Weights, context: int | None = None) -> dict | None:
    """vLLM's dynamic-speculation config: num_speculative_tokens (the largest K) and the table
    num_speculative_tokens_per_batch_size. context None: the whole grid, as
    [bs_lo, bs_hi, ctx_lo, ctx_hi, K] where the schedule has several context bands; else the
    [bs_lo, bs_hi, K] table of the context band holding `context`. None where K is 0
    everywhere (off: no speculative config) or the bands run several drafters (vllm_note)."""
    check_vllm(schedule)
    if vllm_note(schedule) is not None:
        return None
    grid = k_grid(schedule)
    if context is None and len(grid.contexts) > 1:
        table = [
            [b_lo, b_hi, c_lo, c_hi, int(grid.k[i, j])]
            for i, (b_lo, b_hi) in enumerate(grid.batches)
            for j, (c_lo, c_hi) in enumerate(grid.contexts)
        ]
        k = grid.k
    else:
        j = 0 if context is None else next(j for j, (lo, hi) in enumerate(grid.contexts) if lo <= context <= hi)
        batches, k = merged(grid.batches, grid.k[:, [j]])
        table = [[lo, hi, int(row[0])] for (lo, hi), row in zip(batches, k)]
    if k.max() == 0:
        return None
    (drafter,) = schedule.drafters
    return {
        "method": VLLM_METHODS[drafter],
        "model": weights[drafter],
        "num_speculative_tokens": int(k.max()),
        "num_speculative_tokens_per_batch_size": table,
    }


def dump_json(data: dict) -> str:
    return compact_json(data) + "\n"


def vllm_files(schedule: SpeculationSchedule, weights: Weights) -> dict[str, str]:
    check_vllm(schedule)
    files = {}
    dynamic = vllm_dynamic_config(schedule, weights)
    if dynamic is not None:
        files["speculative-config.dynamic.json"] = dump_json(dynamic)
        contexts = k_grid(schedule).contexts
        for lo, hi in contexts if len(contexts) > 1 else ():
            one = vllm_dynamic_config(schedule, weights, context=lo)
            if one is not None:
                files[f"speculative-config.dynamic.context-{lo}-{hi}.json"] = dump_json(one)
    for bands in by_tree(schedule).values():
        config = vllm_band_config(bands[0], weights)
        if config is not None:
            files[f"speculative-config.{file_stem(bands[0])}.json"] = dump_json(config)
    files["schedule.json"] = schedule.to_json() + "\n"  # the chain schedule these rest on
    return files


# ----------------------------------------------------------------------------- SGLang

# --speculative-algorithm of each drafter, https://docs.sglang.io/docs/advanced_features/speculative_decoding:
# EAGLE is its EAGLE-2 (the tree's steps, top-k and draft tokens); STANDALONE a separate small draft model
# (top-k 1: a chain). SGLang has no Medusa drafter: a Medusa band's arguments size its EAGLE tree.
SGLANG_ALGORITHMS = {"medusa": "EAGLE", "eagle": "EAGLE", "draft": "STANDALONE"}
SGLANG_NOTES = {
    "medusa": "SGLang has no Medusa drafter: these arguments size its EAGLE draft tree like this one",
    "eagle": "SGLang's EAGLE drafts EAGLE-2's tree: num-steps passes over the top-k nodes, num-draft-tokens verified "
    "(root included)",
    "draft": "SGLang's STANDALONE drafts with a separate small model: a chain of num-steps tokens (top-k 1)",
}


def sglang_args(band: ScheduleBand, weights: Weights) -> list[str]:
    """SGLang server arguments of a draft tree the size and shape of the band's; [] when off.
    An EAGLE or draft-model band names its weights (a Medusa band has none SGLang loads)."""
    if not band.speculate:
        return []
    path = [] if band.drafter == "medusa" else ["--speculative-draft-model-path", weights[band.drafter]]
    return [
        "--speculative-algorithm",
        SGLANG_ALGORITHMS[band.drafter],
        *path,
        "--speculative-num-steps",
        str(band.depth),
        "--speculative-eagle-topk",
        str(band.top_k),
        "--speculative-num-draft-tokens",
        str(band.tree_size),
    ]


def sglang_files(schedule: SpeculationSchedule, weights: Weights) -> dict[str, str]:
    files = {}
    for bands in by_tree(schedule).values():
        # an off band takes the note of the schedule's one drafter (none for best's)
        note = SGLANG_NOTES.get(bands[0].drafter if bands[0].speculate else schedule.drafter)
        lines = [*provenance(schedule, bands), *([note] if note else [])]
        files[f"server-args.{file_stem(bands[0])}.txt"] = commented(
            lines, shlex.join(sglang_args(bands[0], weights)) + "\n"
        )
    return files


# ----------------------------------------------------------------------------- TensorRT-LLM

TRTLLM_NOTES = {
    "medusa": "Medusa runs on TensorRT-LLM's TensorRT backend: build the engine with max_draft_len >= this one's",
    "eagle": "EAGLE-2's dynamic tree (use_dynamic_tree) on TensorRT-LLM's TensorRT backend: max_draft_len counts the "
    "tree's draft tokens, num_eagle_layers its depth; older releases name speculative_model speculative_model_dir",
    "draft": "the draft/target form runs on TensorRT-LLM's PyTorch backend with the overlap scheduler off; older "
    "releases name speculative_model speculative_model_dir",
}


def trtllm_options(band: ScheduleBand, heads: int, weights: Weights) -> dict:
    """trtllm-serve's extra LLM API options for one band, or {} when off: a MedusaDecodingConfig
    (`heads`: the model's Medusa heads), an EagleDecodingConfig or a DraftTargetDecodingConfig."""
    if not band.speculate:
        return {}
    if band.drafter == "eagle":
        # EagleDecodingConfig, https://nvidia.github.io/TensorRT-LLM/1.3.0rc27/llm-api/reference/EagleDecodingConfig.html:
        # EAGLE-2's dynamic tree as TensorRT-LLM's test_llm_api_eagle2 sets it (max_draft_len = the tree's draft
        # tokens, num_eagle_layers = its depth, dynamic_tree_max_topK = the top-k each node expands,
        # max_non_leaves_per_layer = the nodes each pass expands: both the band's top_k)
        return {
            "speculative_config": {
                "decoding_type": "Eagle",
                "max_draft_len": band.draft_tokens,
                "num_eagle_layers": band.depth,
                "max_non_leaves_per_layer": band.top_k,
                "use_dynamic_tree": True,
                "dynamic_tree_max_topK": band.top_k,
                "speculative_model": weights["eagle"],
            }
        }
    if band.drafter == "draft":
        # DraftTargetDecodingConfig and disable_overlap_scheduler, as the Draft/Target section of
        # https://nvidia.github.io/TensorRT-LLM/1.4.0rc1/features/speculative-decoding.html runs it
        return {
            "disable_overlap_scheduler": True,
            "speculative_config": {
                "decoding_type": "DraftTarget",
                "max_draft_len": band.draft_tokens,
                "speculative_model": weights["draft"],
            },
        }
    return {
        "speculative_config": {
            "decoding_type": "Medusa",
            "max_draft_len": band.draft_tokens,
            "num_medusa_heads": heads,
            "medusa_choices": [list(p) for p in band.paths],
        }
    }


def trtllm_files(schedule: SpeculationSchedule, weights: Weights) -> dict[str, str]:
    files = {}
    for bands in by_tree(schedule).values():
        note = TRTLLM_NOTES.get(bands[0].drafter if bands[0].speculate else schedule.drafter)
        options = trtllm_options(bands[0], schedule.medusa_heads, weights)
        files[f"extra-llm-api-options.{file_stem(bands[0])}.yaml"] = commented(
            [*provenance(schedule, bands), *([note] if note else [])],
            yaml.safe_dump(options, default_flow_style=None, sort_keys=False),
        )
    return files


# ----------------------------------------------------------------------------- files


def export_files(
    schedule: SpeculationSchedule, engine: str, heads: str | Mapping[str, str] | None = None
) -> dict[str, str]:
    """The files of one engine's export: name -> text. vllm needs a chain schedule. heads: the
    drafters' weights (drafter_weights)."""
    if engine == "vllm":
        return vllm_files(schedule, drafter_weights(schedule, heads))
    if engine == "sglang":
        return sglang_files(schedule, drafter_weights(schedule, heads))
    if engine == "tensorrt-llm":
        return trtllm_files(schedule, drafter_weights(schedule, heads))
    if engine == "json":
        return {"schedule.json": schedule.to_json() + "\n"}
    raise PerfkitError(f"unknown engine {engine!r}; choose from: {', '.join(ENGINES)}")


def write_exports(
    schedule: SpeculationSchedule,
    engines,
    out: str | Path,
    heads: str | Mapping[str, str] | None = None,
    chains: SpeculationSchedule | None = None,
) -> list[Path]:
    """Every file of the engines' exports, under out/<engine>/ (json: out/schedule.json).
    heads: the drafters' weights (drafter_weights). chains: the chain schedule vLLM's export
    is made from (needed with vllm, unless `schedule` is one)."""
    out = Path(out)
    engines = check_engines(engines)
    if "vllm" in engines:
        chains = chains or schedule
        check_vllm(chains)
    written = []
    for engine in engines:
        folder = out if engine == "json" else out / engine
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in export_files(chains if engine == "vllm" else schedule, engine, heads).items():
            path = folder / name
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written
