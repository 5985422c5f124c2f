"""What one draft pass of a feature-level drafter runs, by the drafter's own weights: an EAGLE
head, an EAGLE-3 head, or a checkpoint's MTP module.

- EAGLE (-1, -2): the sampled token's embedding, the fc [f; e] (2h) -> h, one decoder layer of
  the target's shapes (or of its config's), the target's LM head and a top-k over its logits.
- EAGLE-3 (Li et al. 2025): on the first pass the fc fuses three of the target's layers'
  features, [f_low; f_mid; f_high] (3h) -> h; on every pass the layer's q/k/v read the sampled
  token's embedding beside the feature, [e; f] (2h), each RMS-normed (a second norm); its own LM
  head of draft_vocab_size rows (its config's; the target's vocabulary where it has none) and a
  top-k over them. Later passes feed the layer's own output back, so the 3h fc runs once.
- MTP (DeepSeek-V3's multi-token prediction, MiMo's): a pass is one module: the embedding and
  the feature each RMS-normed, eh_proj [e; f] (2h) -> h, one decoder layer of the target's
  shapes, the shared head (a final norm and the target's LM head). With fewer modules than draft
  passes vLLM and SGLang run the last module again; every module has the same shapes, so the
  price is the same.

The ops are those of perfmodel.models.operators (eagle_fc, eagle3_fc, eagle3_qkv beside one
layer's), so a drafter is priced by the same latency source as its target: a head of other shapes
than the target's (its own config, EAGLE-3's vocabulary) through `latency_for`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from perfmodel.base.drafter_kind import FEATURE_DRAFTERS, DrafterKind
from perfmodel.base.errors import PerfkitError
from perfmodel.latency.latency_model import LatencyModel
from perfmodel.latency.roofline import RooflineLatency
from perfmodel.latency.step import StepFlavor, StepOp, check_flavor, layer_ops
from perfmodel.models.config import ModelConfig
from perfmodel.models.moe import layer_slice

FC_OPS = {DrafterKind.EAGLE: "eagle_fc", DrafterKind.EAGLE3: "eagle3_fc", DrafterKind.MTP: "eagle_fc"}


@dataclass(frozen=True)
class DraftWeights:
    """A feature-level drafter's weights (module doc). kind: EAGLE, EAGLE-3 or MTP; layer: the
    head's own shapes, whole (its layers and, as its vocabulary, its LM head's rows), from its
    config.json; None: one layer of the target's shapes and the target's LM head."""

    kind: DrafterKind = DrafterKind.EAGLE
    layer: ModelConfig | None = None

    def __post_init__(self) -> None:
        if self.kind not in FEATURE_DRAFTERS:
            raise PerfkitError(
                f"{self.kind} does not draft at the feature level; choose from: {', '.join(FEATURE_DRAFTERS)}"
            )

    def pass_model(self, shard: ModelConfig) -> ModelConfig:
        """The shapes a draft pass runs on one device of the target's `shard`: the head's
        layer(s) and LM head, split as the target is."""
        if self.layer is None:
            return layer_slice(shard, 1, dense=self.kind != DrafterKind.MTP)
        return self.layer.shard(shard.tp)

    def pass_ops(self, shard: ModelConfig, flavor: str, cached: bool = True, first: bool = True) -> tuple[StepOp, ...]:
        """The ops of one draft pass (module doc): the paper's layer, or the head's layer(s)
        with the embedding and its fc and, over the nodes expanded (tokens="expanded"), the LM
        head and the top-k. A drafter without a KV cache (cached=False) writes none, builds
        its mask every pass and ends in a norm, as the reference decoder's does. first: the
        pass over the root (EAGLE-3's 3h fc runs there only)."""
        check_flavor(flavor)
        model = self.pass_model(shard)
        if flavor == StepFlavor.PAPER:
            return layer_ops(model, "paper")
        layer = layer_ops(model, flavor)
        if self.kind == DrafterKind.EAGLE3:
            layers = model.num_layers
            layer = (
                *(item for item in layer if item.op not in ("qkv", "q", "k", "v")),
                StepOp("eagle3_qkv", layers),
                StepOp("norm", label="hidden_norm"),
            )
        if not cached:
            layer = (
                *(item for item in layer if item.op != "kv_write"),
                StepOp("mask", kv=True),
                StepOp("norm", label="final_norm"),
            )
        fc = () if self.kind == DrafterKind.EAGLE3 and not first else (StepOp(FC_OPS[self.kind]),)
        norms = (StepOp("norm", 3, label="mtp_norms"),) if self.kind == DrafterKind.MTP else ()
        expanded = (StepOp("lm_head", tokens="expanded"), StepOp("draft_topk", tokens="expanded"))
        return (*layer, *fc, *norms, *expanded)

    def describe(self) -> str:
        if self.kind == DrafterKind.MTP:
            return "the checkpoint's MTP module: two norms, eh_proj 2h -> h, one layer of the target's, shared head"
        layer = "one layer of the target's shapes" if self.layer is None else f"{self.layer.name}'s layer(s)"
        if self.kind == DrafterKind.EAGLE:
            return f"EAGLE's head: fc 2h -> h, {layer}, the target's LM head"
        vocab = "the target's vocabulary" if self.layer is None else f"{self.layer.vocab_size:,} rows"
        return f"EAGLE-3's head: fc 3h -> h on the first pass, {layer} with 2h q/k/v, its LM head of {vocab}"


EAGLE_WEIGHTS = DraftWeights()


def latency_for(latency, model: ModelConfig):
    """`latency` pricing the shapes of `model` (a drafter's head beside its target): a source
    priced from shapes (a roofline, GEMM grids or calibrations) takes the drafter's; one that
    holds its target's own measured rows cannot, and says so."""
    if getattr(latency, "model", None) == model:
        return latency
    if isinstance(latency, LatencyModel):
        # its measured step-op rows are of the target's shard, not the drafter's
        return dataclasses.replace(latency, model=model, elementwise=None)
    if isinstance(latency, RooflineLatency):
        return dataclasses.replace(latency, model=model)
    raise PerfkitError(
        f"{type(latency).__name__} prices its own model's ops only; a drafter of other shapes ({model.name}) is priced "
        "from a roofline, GEMM grids or calibrations (--latency auto, grid, calibrated or datasheet)"
    )
