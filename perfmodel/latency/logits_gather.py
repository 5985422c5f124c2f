"""The gather of a vocabulary-split LM head's logits under tensor parallelism.

Engines split the LM head (and each Medusa head's vocabulary projection) over the vocabulary
(perfmodel.models.config.ModelConfig.vocab_per_device): every device computes its share of
every row's logits, then the shares are gathered, over NCCL (vLLM's LogitsProcessor gathers
to the first rank with torch.distributed, vllm/model_executor/layers/logits_processor.py;
TensorRT-LLM's LM head is a ColumnLinear with gather_output). A step gathers rows x vocab x
element bytes: one row per token the LM head runs on, and one per sequence and head for the
Medusa heads' logits.

`gather_source(device, all_reduce)` times it: the device's NCCL all_gather tables
(aiconfigurator-core's nccl_perf, `<device>/aiconfigurator/nccl-<version>/all_gather.parquet`,
bytes = the gathered buffer, nccl-tests' convention; per GPU count the newest NCCL version),
else half the device's all-reduce of the same bytes (a ring all-reduce is a reduce-scatter and
an all-gather of the same bytes), labelled as modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.base.dtypes import element_bytes
from perfmodel.latency.allreduce import AllReduceSource
from perfmodel.latency.allreduce_tables import Device, MeasuredAllReduce, MeasuredTable, device_stacks
from perfmodel.measured.aiconfigurator import version_key

GATHER_TABLE = "all_gather"


@dataclass(frozen=True)
class HalfAllReduce:
    """An all-gather modelled as half an all-reduce of the same bytes, where none was measured."""

    all_reduce: AllReduceSource
    kind: str = "modelled"

    def time(self, nbytes, workers):
        return 0.5 * np.asarray(self.all_reduce.time(nbytes, workers), dtype=float)

    def label_for(self, workers: int) -> str:
        return f"modelled as half an all-reduce of the same bytes ({self.all_reduce.label_for(workers)})"


GatherSource = MeasuredAllReduce | HalfAllReduce  # what gather_source gives


def gather_source(device: Device, all_reduce: AllReduceSource) -> GatherSource:
    """The device's NCCL all_gather tables where shipped, else half its all-reduce."""
    device_key, stacks = device_stacks(device)
    tables: dict[int, MeasuredTable] = {}
    found = sorted((s for s in stacks if s.has(GATHER_TABLE)), key=lambda s: version_key(s.version))
    for shipped in found:  # oldest first: a newer version overwrites
        system = shipped.provenance.get("system", device_key)
        origin = f"NCCL {shipped.version} all_gather_perf (nccl-tests) on {system}, from {shipped.package}"
        table = MeasuredTable(shipped.stack, system, shipped.folder / f"{GATHER_TABLE}.parquet", origin)
        tables.update(dict.fromkeys(table.curves(), table))
    return MeasuredAllReduce.of(tables) if tables else HalfAllReduce(all_reduce)


def gather_time(rows, vocab: int, tp: int, dtype: str, source: GatherSource) -> np.ndarray:
    """Seconds to gather `rows` rows of logits over the whole vocabulary from tp devices."""
    nbytes = np.asarray(rows, dtype=float) * vocab * element_bytes(dtype)
    if tp == 1:
        return np.zeros(nbytes.shape)
    return np.where(nbytes > 0, np.asarray(source.time(nbytes, tp), dtype=float), 0.0)
