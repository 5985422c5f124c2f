"""The closed loop run end to end: a checkpoint's decoder measured and its speedups
predicted, batch size by batch size."""

from __future__ import annotations

import pandas as pd
import torch

from decoder.checkpoint import load_checkpoint
from decoder.medusa import Decoder
from decoder.runs import heldout_prompts
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.models.config import load_model
from profilers.closed_loop.compare import print_batch
from profilers.closed_loop.config import ValidateConfig
from profilers.closed_loop.eagle import drafting_to_time, eagle_untimed_passes
from profilers.closed_loop.in_step import beside_priced, in_step_profile
from profilers.closed_loop.predict import Measured, priced_runs, step_contexts
from profilers.closed_loop.runs import (
    PROBE_LEAD,
    PROBE_STEPS,
    ExtraTimings,
    dynamic_build_s,
    operator_rows,
    operator_timing,
    timed_runs,
)
from profilers.closed_loop.tree_kind import TreeKind
from profilers.closed_loop.untimed import decode_kwargs, untimed_passes
from profilers.device import torch_threads


def validate(config: ValidateConfig, log=print) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(per-tree comparison, measured op rows, summary)."""

    if config.device == "cuda" and not torch.cuda.is_available():
        raise PerfkitError("--device cuda: no CUDA device is visible to torch on this machine; use --device cpu")
    ckpt = load_checkpoint(config.model)
    if ckpt.heads is None and config.drafter == DrafterKind.MEDUSA:
        raise PerfkitError(f"{ckpt.folder} has no Medusa heads to validate")
    model = load_model(ckpt.folder)
    dtype = "fp32"  # the reference decoder runs checkpoints in fp32
    torch.manual_seed(config.seed)
    decoder = Decoder(ckpt, config.device)
    prompts = heldout_prompts(ckpt, config.prompts, config.prompt_len, config.seed)
    probe_prompts = heldout_prompts(
        ckpt, config.batch, max(1, config.context - PROBE_LEAD - PROBE_STEPS // 2), config.seed + 1
    )
    eagle = config.drafter == DrafterKind.EAGLE
    with torch_threads(config.threads):
        record = (eagle_untimed_passes if eagle else untimed_passes)(decoder, prompts, config, log)
        contexts = step_contexts(record, config)
        # with EAGLE, the drafts' ops and drafts timed alone (their host overhead) besides the step's
        drafting = drafting_to_time(model, config, record, decoder, probe_prompts[0]) if eagle else ((), ())
        timing = operator_timing(model, config, dtype, decoder, probe_prompts, contexts, log, ExtraTimings(*drafting))
        runs = timed_runs(decoder, prompts, config, record, log, between=timing.sample_share)
        rows, plain_step_s, drafts_s = operator_rows(timing)
        build_s = {
            r["tree_size"]: dynamic_build_s(decoder, record.step_probs, r["tree_size"] - 1)
            for r in runs
            if r["tree_kind"] == TreeKind.DYNAMIC
        }
    measured = Measured(runs, rows, plain_step_s, contexts, build_s, drafts_s)
    table, summary = priced_runs(config, model, dtype, record, measured)
    if config.in_step:
        log("profiling every setting's operators inside the step (hooks on, untimed for the speedups) ...")
        with torch_threads(config.threads):
            settings = {key: kwargs | decode_kwargs(config) for key, kwargs in record.settings.items()}
            profile = in_step_profile(decoder, prompts[: config.batch], settings, config.new_tokens)
        summary["in_step"] = beside_priced(profile, summary["priced_ops"])
    return table, rows, summary


def run_batches(configs: list[ValidateConfig], log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Every config's closed loop in turn, each batch's comparison printed as it finishes:
    (the comparisons, the measured operator rows, each marked with its closed_loop_batch)."""
    tables, all_rows = [], []
    for config in configs:
        log(f"--- batch {config.batch}")
        table, rows, summary = validate(config, log)
        tables.append(table)
        all_rows.append(rows.assign(closed_loop_batch=config.batch))
        print(f"batch {config.batch}:")
        print_batch(table, summary)
    return pd.concat(tables, ignore_index=True), pd.concat(all_rows, ignore_index=True)
