"""A speculation schedule (perfmodel.planning.schedule) in the serving engines' own formats, as
Python data and as files, one file per tree the schedule runs (its comment, where the format
takes one, lists the bands it runs in):

- vLLM (docs.vllm.ai, features/speculative_decoding): vLLM's Medusa drafts one token per head,
  the top-1 of heads 1..K (vllm/v1/spec_decode/medusa.py; K sets the number of heads it uses),
  so its export is made from a `chain` schedule. Per chain, the `--speculative-config` JSON
  {method: medusa, model: the heads, num_speculative_tokens: K, speculative_token_tree: the
  chain's paths}; and the dynamic-speculation table `num_speculative_tokens_per_batch_size`
  (features/speculative_decoding/dynamic_speculative_decoding): entries [bs_lo, bs_hi, K], or
  [bs_lo, bs_hi, ctx_lo, ctx_hi, K] on a rectangular (batch x context) grid where vLLM reads
  context ranges (vllm/v1/spec_decode/dynamic/utils.py); K = 0 is off. One batch-only table
  per context band too, for versions that read batch ranges only.
- SGLang (docs.sglang.io, advanced_features/speculative_decoding): the server arguments of a
  draft tree of the same budget: `--speculative-num-steps` = depth, `--speculative-eagle-topk`
  = the widest rank used + 1, `--speculative-num-draft-tokens` = tokens verified, root
  included. SGLang has no Medusa drafter: these size its EAGLE tree like the schedule's; no
  arguments = off.
- TensorRT-LLM (nvidia.github.io/TensorRT-LLM, the LLM API's MedusaDecodingConfig): the
  `trtllm-serve --extra_llm_api_options` YAML {speculative_config: {decoding_type: Medusa,
  max_draft_len, num_medusa_heads, medusa_choices}}; an empty mapping = off.
- json: the schedule's own JSON (SpeculationSchedule.to_json), which says what every number
  rests on. Engine JSON carries the engine's own keys only (a config is checked against its
  fields); the YAML and SGLang files say it in comments.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from perfmodel.acceptance.trees import Tree
from perfmodel.base.errors import PerfkitError
from perfmodel.planning.schedule import ScheduleBand, SpeculationSchedule, compact_json

ENGINES = ("vllm", "sglang", "tensorrt-llm", "json")
SGLANG_ALGORITHM = "EAGLE"  # SGLang's tree drafter; it has no Medusa one


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


def heads_path(schedule: SpeculationSchedule, heads: str | None) -> str:
    """Where the engine loads the Medusa heads from: given, else a placeholder to replace."""
    return heads or f"{schedule.model}-medusa"


def by_tree(schedule: SpeculationSchedule) -> dict[int, list[ScheduleBand]]:
    """The bands each tree size runs in, off (1) first, then by size."""
    out: dict[int, list[ScheduleBand]] = {}
    for band in sorted(schedule.bands, key=lambda b: b.tree_size):
        out.setdefault(band.tree_size, []).append(band)
    return out


def provenance(schedule: SpeculationSchedule, bands: list[ScheduleBand]) -> list[str]:
    """What one export file's numbers rest on, as comment lines."""
    size = bands[0].tree_size
    what = (
        f"a tree of {size} tokens ({bands[0].acceptance:.2f} tokens/step)"
        if size > 1
        else "off: plain decoding" + (" (medusa off)" if schedule.medusa == "off" else ", no tree beats it")
    )
    gains = "; ".join(f"{b.label()} ({b.speedup:.2f}x)" for b in bands)
    return [
        f"medusa-perfkit speculation schedule: {schedule.model} on {schedule.device}, tp={schedule.tp}, "
        f"{schedule.dtype}, medusa {schedule.medusa}",
        f"{what}, predicted speedup over plain decoding in: {gains}",
        f"step times rest on: {'/'.join(dict.fromkeys(b.evidence for b in bands))} ({schedule.latency})",
        f"acceptance: {schedule.acceptance}",
    ]


def commented(lines: list[str], body: str) -> str:
    return "".join(f"# {line}\n" for line in lines) + body


def file_stem(size: int) -> str:
    return f"tree-{size}" if size > 1 else "off"


# ----------------------------------------------------------------------------- vLLM


def vllm_tree(paths) -> str:
    """vLLM's speculative_token_tree: the paths as a Python literal of tuples, breadth first."""
    return str([tuple(p) for p in sorted(paths, key=lambda p: (len(p), p))])


def check_vllm(schedule: SpeculationSchedule) -> None:
    """vLLM's Medusa runs chains of at most the model's heads: refuse any other tree."""
    for band in schedule.bands:
        chain = all(path == (0,) * len(path) for path in band.paths)
        if not chain or band.draft_tokens > schedule.medusa_heads:
            raise PerfkitError(
                f"vLLM's Medusa drafts one token per head (a chain of at most {schedule.medusa_heads}); the tree of "
                f"{band.tree_size} tokens at {band.label()} is not one: export vLLM from a chain schedule "
                "(speculation_schedule(..., family='chain'))"
            )


def vllm_band_config(band: ScheduleBand, heads: str) -> dict | None:
    """The --speculative-config of one band's tree, or None (off: no speculative config)."""
    if not band.speculate:
        return None
    return {
        "method": "medusa",
        "model": heads,
        "num_speculative_tokens": band.draft_tokens,
        "speculative_token_tree": vllm_tree(band.paths),
    }


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


def vllm_dynamic_config(schedule: SpeculationSchedule, heads: str, context: int | None = None) -> dict | None:
    """vLLM's dynamic-speculation config: num_speculative_tokens (the largest K) and the table
    num_speculative_tokens_per_batch_size. context None: the whole grid, as
    [bs_lo, bs_hi, ctx_lo, ctx_hi, K] where the schedule has several context bands; else the
    [bs_lo, bs_hi, K] table of the context band holding `context`. None where K is 0
    everywhere (off: no speculative config)."""
    check_vllm(schedule)
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
    return {
        "method": "medusa",
        "model": heads,
        "num_speculative_tokens": int(k.max()),
        "num_speculative_tokens_per_batch_size": table,
    }


def dump_json(data: dict) -> str:
    return compact_json(data) + "\n"


def vllm_files(schedule: SpeculationSchedule, heads: str) -> dict[str, str]:
    check_vllm(schedule)
    files = {}
    dynamic = vllm_dynamic_config(schedule, heads)
    if dynamic is not None:
        files["speculative-config.dynamic.json"] = dump_json(dynamic)
        contexts = k_grid(schedule).contexts
        for lo, hi in contexts if len(contexts) > 1 else ():
            one = vllm_dynamic_config(schedule, heads, context=lo)
            if one is not None:
                files[f"speculative-config.dynamic.context-{lo}-{hi}.json"] = dump_json(one)
    for size, bands in by_tree(schedule).items():
        config = vllm_band_config(bands[0], heads)
        if config is not None:
            files[f"speculative-config.{file_stem(size)}.json"] = dump_json(config)
    files["schedule.json"] = schedule.to_json() + "\n"  # the chain schedule these rest on
    return files


# ----------------------------------------------------------------------------- SGLang


def sglang_args(band: ScheduleBand, algorithm: str = SGLANG_ALGORITHM) -> list[str]:
    """SGLang server arguments of a draft tree the size and shape of the band's; [] when off."""
    if not band.speculate:
        return []
    tree = Tree(band.paths)
    return [
        "--speculative-algorithm",
        algorithm,
        "--speculative-num-steps",
        str(tree.depth),
        "--speculative-eagle-topk",
        str(tree.max_rank + 1),
        "--speculative-num-draft-tokens",
        str(tree.size),
    ]


def sglang_files(schedule: SpeculationSchedule) -> dict[str, str]:
    note = "SGLang has no Medusa drafter: these arguments size its EAGLE draft tree like this one"
    return {
        f"server-args.{file_stem(size)}.txt": commented(
            [*provenance(schedule, bands), note], shlex.join(sglang_args(bands[0])) + "\n"
        )
        for size, bands in by_tree(schedule).items()
    }


# ----------------------------------------------------------------------------- TensorRT-LLM


def trtllm_options(band: ScheduleBand, heads: int) -> dict:
    """trtllm-serve's extra LLM API options for one band: a MedusaDecodingConfig, or {} when off."""
    if not band.speculate:
        return {}
    return {
        "speculative_config": {
            "decoding_type": "Medusa",
            "max_draft_len": band.draft_tokens,
            "num_medusa_heads": heads,
            "medusa_choices": [list(p) for p in band.paths],
        }
    }


def trtllm_files(schedule: SpeculationSchedule) -> dict[str, str]:
    note = "Medusa runs on TensorRT-LLM's TensorRT backend: build the engine with max_draft_len >= this one's"
    return {
        f"extra-llm-api-options.{file_stem(size)}.yaml": commented(
            [*provenance(schedule, bands), note],
            yaml.safe_dump(trtllm_options(bands[0], schedule.medusa_heads), default_flow_style=None, sort_keys=False),
        )
        for size, bands in by_tree(schedule).items()
    }


# ----------------------------------------------------------------------------- files


def export_files(schedule: SpeculationSchedule, engine: str, heads: str | None = None) -> dict[str, str]:
    """The files of one engine's export: name -> text. vllm needs a chain schedule."""
    if engine == "vllm":
        return vllm_files(schedule, heads_path(schedule, heads))
    if engine == "sglang":
        return sglang_files(schedule)
    if engine == "tensorrt-llm":
        return trtllm_files(schedule)
    if engine == "json":
        return {"schedule.json": schedule.to_json() + "\n"}
    raise PerfkitError(f"unknown engine {engine!r}; choose from: {', '.join(ENGINES)}")


def write_exports(
    schedule: SpeculationSchedule,
    engines,
    out: str | Path,
    heads: str | None = None,
    chains: SpeculationSchedule | None = None,
) -> list[Path]:
    """Every file of the engines' exports, under out/<engine>/ (json: out/schedule.json).
    chains: the chain schedule vLLM's export is made from (needed with vllm, unless
    `schedule` is one)."""
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
