"""A speculation schedule (perfmodel.planning.schedule) in the serving engines' own formats, as
Python data and as files, one file per drafter and tree the schedule runs (its comment, where
the format takes one, lists the bands it runs in):

- vLLM (docs.vllm.ai, features/speculative_decoding): vLLM's Medusa drafts one token per head,
  the top-1 of heads 1..K (vllm/v1/spec_decode/medusa.py; K sets the number of heads it uses),
  and its EAGLE one token per draft pass by default, so its export is made from a `chain`
  schedule. Per chain, the `--speculative-config` JSON {method: medusa, model: the heads,
  num_speculative_tokens: K} (a chain is vLLM's own draft: no speculative_token_tree, which
  vLLM 0.32.0 refuses), {method: eagle, model:
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
- A measured chain of K drafts (EAGLE-3, MTP, n-gram): vLLM {method: eagle3, model: the head},
  {method: mtp} (the module read from the target's checkpoint) or {method: ngram,
  prompt_lookup_min/max: the range measured}, each with num_speculative_tokens K; SGLang EAGLE3 or
  EAGLE (MTP, no draft path) with K steps, top-k 1 and K + 1 draft tokens, or NGRAM with K + 1
  draft tokens at BFS breadth 1; TensorRT-LLM {decoding_type: Eagle, eagle3_one_model: true},
  {decoding_type: MTP, num_nextn_predict_layers: K} or {decoding_type: NGram, max_draft_len: K}.
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
from pathlib import Path

import yaml

from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import write_file
from perfmodel.measured.ngram_host import LOOKUP_N
from perfmodel.planning.engine_export_common import Weights, by_tree, commented, drafter_weights, file_stem, provenance
from perfmodel.planning.engine_export_vllm import check_vllm, vllm_files
from perfmodel.planning.schedule_format import ScheduleBand, SpeculationSchedule

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


# ----------------------------------------------------------------------------- SGLang

# --speculative-algorithm of each drafter, https://docs.sglang.io/docs/advanced_features/speculative_decoding:
# EAGLE is its EAGLE-2 (the tree's steps, top-k and draft tokens); STANDALONE a separate small draft model
# (top-k 1: a chain). SGLang has no Medusa drafter: a Medusa band's arguments size its EAGLE tree.
# EAGLE3 its EAGLE-3 head; an MTP module runs as EAGLE with the target's own checkpoint (no draft path:
# SGLang reads the module from it); NGRAM its n-gram cache, from 0.5.3 (python/sglang/srt/server_args.py).
SGLANG_ALGORITHMS = {
    "medusa": "EAGLE",
    "eagle": "EAGLE",
    "draft": "STANDALONE",
    "eagle3": "EAGLE3",
    "mtp": "EAGLE",
    "ngram": "NGRAM",
}
SGLANG_NOTES = {
    "medusa": "SGLang has no Medusa drafter: these arguments size its EAGLE draft tree like this one",
    "eagle": "SGLang's EAGLE drafts EAGLE-2's tree: num-steps passes over the top-k nodes, num-draft-tokens verified "
    "(root included)",
    "draft": "SGLang's STANDALONE drafts with a separate small model: a chain of num-steps tokens (top-k 1)",
    "eagle3": "SGLang's EAGLE3 drafts a chain: num-steps passes of the head, top-k 1, num-draft-tokens verified (root "
    "included)",
    "mtp": "SGLang runs the checkpoint's MTP module as EAGLE from the target's own weights (no draft path), once per "
    "draft",
    "ngram": "SGLang >= 0.5.3: its n-gram cache holds every request's tokens (vLLM's and TensorRT-LLM's per-request "
    "lookup reads one): rates measured with one may not hold with the other; BFS breadth 1 expands one node a level, "
    "though matches of several lengths may still branch at the root (its matchBFS, read from source, not run)",
}
# SGLang's n-gram lookup: its draft tokens count the root, and a breadth of 1 drafts a chain.
SGLANG_NGRAM_CHAIN = ("--speculative-ngram-min-bfs-breadth", "1", "--speculative-ngram-max-bfs-breadth", "1")


def sglang_args(band: ScheduleBand, weights: Weights) -> list[str]:
    """SGLang server arguments of a draft tree the size and shape of the band's; [] when off.
    An EAGLE or draft-model band names its weights (a Medusa band has none SGLang loads)."""
    if not band.speculate:
        return []
    if band.drafter == DrafterKind.NGRAM:
        algorithm = ["--speculative-algorithm", SGLANG_ALGORITHMS[band.drafter]]
        return [*algorithm, "--speculative-num-draft-tokens", str(band.tree_size), *SGLANG_NGRAM_CHAIN]
    own = band.drafter not in (DrafterKind.MEDUSA, DrafterKind.MTP)  # Medusa: none SGLang loads; MTP: the target's
    path = ["--speculative-draft-model-path", weights[band.drafter]] if own else []
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
    "eagle3": "EAGLE-3 as one model with the target on TensorRT-LLM's PyTorch backend, a chain of max_draft_len; newer "
    "releases also name it decoding_type Eagle3 and the path speculative_model (these names stay accepted)",
    "mtp": "the checkpoint's MTP module on TensorRT-LLM's PyTorch backend, run once per draft: "
    "num_nextn_predict_layers sets the chain (its max_draft_len follows it); its docs list DeepSeek's checkpoints "
    "for MTP",
    "ngram": "n-gram lookup on TensorRT-LLM's PyTorch backend, each request's own pool (is_public_pool false, as vLLM "
    "looks up), the overlap scheduler off as its docs run it",
}


def trtllm_options(band: ScheduleBand, heads: int, weights: Weights) -> dict:
    """trtllm-serve's extra LLM API options for one band, or {} when off: a MedusaDecodingConfig
    (`heads`: the model's Medusa heads), an EagleDecodingConfig or a DraftTargetDecodingConfig."""
    if not band.speculate:
        return {}
    if band.drafter in TRTLLM_CHAINS:
        return TRTLLM_CHAINS[band.drafter](band, weights)
    if band.drafter == DrafterKind.EAGLE:
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
    if band.drafter == DrafterKind.DRAFT:
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


# The chain drafters' decoding configs (TensorRT-LLM 1.0-1.2's llmapi/llm_args.py, the PyTorch backend:
# EagleDecodingConfig with eagle3_one_model, MTPDecodingConfig, NGramDecodingConfig).
TRTLLM_CHAINS = {
    DrafterKind.EAGLE3: lambda band, weights: {
        "speculative_config": {
            "decoding_type": "Eagle",
            "max_draft_len": band.draft_tokens,
            "speculative_model_dir": weights[DrafterKind.EAGLE3],
            "eagle3_one_model": True,
        }
    },
    DrafterKind.MTP: lambda band, weights: {
        "speculative_config": {"decoding_type": "MTP", "num_nextn_predict_layers": band.draft_tokens}
    },
    DrafterKind.NGRAM: lambda band, weights: {
        "disable_overlap_scheduler": True,
        "speculative_config": {
            "decoding_type": "NGram",
            "max_draft_len": band.draft_tokens,
            "max_matching_ngram_size": LOOKUP_N[1],
            "is_public_pool": False,
        },
    },
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
            written.append(write_file(text, folder / name))  # whole or not at all (a full disk)
    return written
