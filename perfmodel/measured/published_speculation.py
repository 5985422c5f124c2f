"""Published measurements of speculative decoding on GPUs, as shipped with a source and date
per row (perfmodel/measured/published_speculation.csv; docs/results/published-speculation.md
says how they were collected and what each source's numbers mean).

A row is one measured configuration: the GPU and its count, the target model, the engine or
implementation, the drafter family (DRAFTER_FAMILIES; `drafter_detail` names the checkpoint or
method), its shape as the source states it, the batch (a count, or `batch_text` where the
source gives a load instead), the acceptance (mean accepted length, per-position rates), and
what was measured: a speedup over plain decoding in the same harness, tokens/s (per user or in
total) or ms per token. `read_published` checks every row before anything is compared with it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from perfmodel.base.attention_code import AttentionCode
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.base.stacks import SERVING_ENGINES

PUBLISHED = Path(__file__).with_name("published_speculation.csv")
DRAFTER_FAMILIES = ("medusa", "eagle", "eagle3", "mtp", "draft", "ngram", "other")
COLUMNS = (
    "gpu", "num_gpus", "num_gpus_text", "model", "dtype", "engine", "drafter", "drafter_detail", "shape",
    "tree_size", "chain_k", "batch", "batch_text", "dataset", "temperature", "accept_length",
    "per_position_acceptance", "speedup", "tokens_per_s", "tokens_per_s_kind", "ms_per_token",
    "source_url", "source_title", "source_date", "source_where", "notes",
    "device", "preset", "tokens_verified", "draft_depth", "draft_top_k", "priced_as", "draft_config", "launch",
    "stack", "draft_tree", "model_code",
)  # fmt: skip
# How a row is priced, where it is: the device (a hw_specs key) and model preset it ran on,
# the tokens each step verified, the draft's depth and top-k, what that rests on, and a draft
# model's shipped config (a folder of perfmodel/models/checkpoints), and the launch regime its
# harness ran in (perfmodel.base.launch: eager for Hugging Face transformers' loop; empty: an
# engine's, priced as the full step), and an engine's row's stack (vllm, sglang, trtllm: whose
# measured tables price it; empty: the device's own choice), and a static tree's name where the
# drafter drafts one (perfmodel.acceptance.reference_trees: EAGLE-1's mc_sim_7b_63), and the
# attention code the method's own model ran where it is not its harness's plain decoding's
# (perfmodel.base.attention_code: matmul for Spec-Bench's Medusa, EAGLE, Hydra and REST rows,
# which run their own modeling_llama_kv.py; empty: the same model code as the baseline).
PRICED = ("device", "preset", "tokens_verified", "priced_as")
COUNTS = ("num_gpus", "tree_size", "chain_k", "batch", "tokens_verified", "draft_depth", "draft_top_k")
NUMBERS = ("temperature", "accept_length", "speedup", "tokens_per_s", "ms_per_token")
MEASURED = ("speedup", "tokens_per_s", "ms_per_token", "accept_length")  # at least one per row
LAUNCHES = tuple(str(regime) for regime in Launch)
STACKS = tuple(SERVING_ENGINES)
CODES = tuple(AttentionCode)
DATE = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")


def read_published(path: Path = PUBLISHED) -> pd.DataFrame:
    """The published rows, checked: the columns, a drafter family, a GPU, a source URL and a
    date on every row, counts and numbers where given, something measured. A bad row is one
    line naming the file, its row and what is wrong."""
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise PerfkitError(f"{path}: not a readable CSV ({exc})") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise PerfkitError(f"{path}: missing column(s) {', '.join(missing)}")
    for index, row in frame.iterrows():
        where = f"{path.name} row {index + 2}"  # the header is line 1
        if row["drafter"] not in DRAFTER_FAMILIES:
            raise PerfkitError(f"{where}: drafter {row['drafter']!r} is none of {', '.join(DRAFTER_FAMILIES)}")
        if not row["gpu"] or not row["source_url"].startswith(("http://", "https://")):
            raise PerfkitError(f"{where}: every row names its GPU and its source's URL")
        if not DATE.match(row["source_date"]):
            raise PerfkitError(f"{where}: source_date {row['source_date']!r} is not YYYY-MM or YYYY-MM-DD")
        bad = [c for c in COUNTS if row[c] and not row[c].isdigit()]
        bad += [c for c in NUMBERS if row[c] and not _is_number(row[c])]
        if bad:
            raise PerfkitError(f"{where}: {', '.join(f'{c} {row[c]!r}' for c in bad)} not a number")
        if not any(row[c] for c in MEASURED):
            raise PerfkitError(f"{where}: nothing measured (one of {', '.join(MEASURED)})")
        if row["stack"] and row["stack"] not in STACKS:
            raise PerfkitError(f"{where}: stack {row['stack']!r} is none of {', '.join(STACKS)} (or empty)")
        if row["model_code"] and row["model_code"] not in CODES:
            raise PerfkitError(f"{where}: model_code {row['model_code']!r} is none of {', '.join(CODES)} (or empty)")
        if row["launch"] and row["launch"] not in LAUNCHES:
            raise PerfkitError(f"{where}: launch {row['launch']!r} is none of {', '.join(LAUNCHES)} (or empty)")
        if any(row[c] for c in PRICED) and not all(row[c] for c in PRICED):
            raise PerfkitError(f"{where}: a priced row gives all of {', '.join(PRICED)}")
    for column in COUNTS:
        frame[column] = pd.to_numeric(frame[column].replace("", None)).astype("Int64")
    for column in NUMBERS:
        frame[column] = pd.to_numeric(frame[column].replace("", None))
    return frame


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
