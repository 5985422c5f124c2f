"""The options the commands share, each declared here and nowhere else: one flag, one
meaning, one help text and one default rule. A command composes them
(`options.model(p, needs_weights=True)`, `options.out(p, "perf-reports/x/<device>")`) and
passes in only what it alone knows: where its output goes by default, what its table is,
the decoder's acceptance schemes (decoder/ sits above this layer, so it cannot be imported).

A `target` is a parser, a subcommand's parser or a mutually exclusive group.

Flags with one meaning each:
  --model NAME|PATH      a model (preset, config.json or checkpoint folder; bundled)
  --gpu NAME             a device spec by name or alias, or cpu     --spec FILE  a spec file
  --device cpu|cuda      a torch device
  --dtype                the data type, default fp16 on a GPU and fp32 on a CPU
  --weight-format, --kv-cache-dtype   the linear weights' and the KV cache's formats (fp8, fp8-block, nvfp4)
  --acceptance           the decoder's verification scheme (greedy, typical, ...)
  --acceptance-rates     the performance model's acceptance rates (paper, paper-ln, eagle, a record)
  --drafter              who drafts the speculative tree: Medusa heads, EAGLE, a draft model, all (best)
  --position-rates, --draft-config   a drafter's measured chain acceptance and its own config.json
  --batch, --context, --tree-size   one step's shape (step_point)
  --weights real|dummy, --replay RECORD   a performance twin (twin)
  --out PATH / --csv FILE   where a command writes its output / its table

How the performance model prices a step (--latency and --stack, --tp, --host-dispatch,
--cuda-graph) is declared in perfmodel.cli.pricing_options.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from perfmodel.acceptance.rates import ACCEPTANCE_PRESETS, EAGLE_ACCEPTANCE, EAGLE_PRESET_TOKENS, EAGLE_PRESET_TREE
from perfmodel.base.dtypes import DTYPES
from perfmodel.base.errors import PerfkitError
from perfmodel.base.launch import Launch
from perfmodel.base.outputs import preflight
from perfmodel.base.precision import KV_CHOICES, WEIGHT_CHOICES
from perfmodel.cli.parser import batch_size, job_count, number_in, token_count
from perfmodel.latency.roofline_table import DEFAULT_MODELS
from perfmodel.models.config import PRESETS
from perfmodel.models.moe import DEFAULT_ROUTING, MoeSplit, Routing
from perfmodel.planning.drafters import DRAFTERS

Target = argparse._ActionsContainer  # a parser or a (mutually exclusive) group of one


def _nargs(many: bool) -> str | None:
    return "+" if many else None


def _required(required: bool) -> dict:
    # A mutually exclusive group refuses the keyword itself, even as False.
    return {"required": True} if required else {}


def model_default(*, needs_weights: bool = False, many: bool = False) -> tuple[str | None, str]:
    """The one default rule of --model, as (value, how --help says it): a command that runs
    a model's weights runs the bundled checkpoint; one that only prices shapes takes the
    paper's llama-7b; one that draws several models (the roofline) the paper's models,
    except where it measures them here (a CPU, --measure), where llama-7b alone keeps the
    sweep short. None: the command applies the rule (it depends on the device)."""
    if needs_weights:
        return "bundled", "bundled, as this command runs a model's weights"
    if many:
        paper = " ".join(DEFAULT_MODELS)
        return None, f"the paper's {paper}; llama-7b alone on a CPU or with --measure"
    return "llama-7b", "the paper's llama-7b"


def model(target: Target, *, needs_weights: bool = False, many: bool = False) -> None:
    default, said = model_default(needs_weights=needs_weights, many=many)
    target.add_argument(
        "--model",
        nargs=_nargs(many),
        default=default,
        metavar="NAME|PATH",
        help=f"a model: a preset name ({', '.join(PRESETS)}, or an alias such as vicuna-7b), a config.json, or a "
        f"checkpoint folder; bundled = the bundled checkpoint (default: {said})",
    )


def gpu(target: Target, *, many: bool = False, required: bool = False, default: str | None = None) -> None:
    """default: what the command takes without one, when it is not required."""
    several = "; several may be given" if many else ""
    said = f" (default: {default})" if default else ""
    target.add_argument(
        "--gpu",
        nargs=_nargs(many),
        metavar="NAME",
        **_required(required),
        help="a device spec in hw_specs/ by name or alias (e.g. a100, h100), or cpu for this machine's CPU (from its "
        f"measured ceilings){several}{said}",
    )


def spec(target: Target, *, many: bool = False) -> None:
    target.add_argument(
        "--spec",
        nargs=_nargs(many),
        type=Path,
        metavar="FILE",
        help="a device spec YAML file of your own (format: hw_specs/README.md)"
        + ("; several may be given" if many else ""),
    )


def device(target: Target, *, default: str | None, default_said: str) -> None:
    """--device: where torch runs. default None: the command picks (default_said says how)."""
    target.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=default,
        help=f"the torch device the model and operators run on (default: {default_said})",
    )


def heads(target: Target) -> None:
    """--heads: a Medusa heads folder kept apart from the model's."""
    target.add_argument("--heads", metavar="DIR", help="Medusa heads folder, when apart from the model")


def recalibrate(target: Target) -> None:
    """--recalibrate: time the decoder's steps again for --tree auto (decoder.auto_tree)."""
    target.add_argument(
        "--recalibrate",
        action="store_true",
        help="--tree auto: measure this machine's step times again instead of using the cached calibration",
    )


def visible_device(target: Target) -> None:
    """--device for a command that measures where torch finds a GPU: cuda if one is visible,
    else cpu, when not given (None: the command looks)."""
    device(target, default=None, default_said="cuda if visible, else cpu")


def dtype(
    target: Target, *, allowed: Sequence[str] = DTYPES, default_said: str = "fp16 on a GPU, fp32 on a CPU"
) -> None:
    """None when not given: the command takes perfmodel.base.dtypes.default_dtype of its
    device, which is known only once the device is resolved; `default_said` is that rule
    in words where the command's differs."""
    target.add_argument("--dtype", help=f"one of {', '.join(allowed)} (default: {default_said})")


def precision(target: Target) -> None:
    """--weight-format and --kv-cache-dtype: the formats a model is served in
    (perfmodel.base.precision), where they are not what its checkpoint declares. None when not
    given: the checkpoint's. (--weights is the performance twin's real or dummy weights.) With
    them --moe-parallel and --routing: how an MoE model's experts are served."""
    declared = "default: what the checkpoint declares in its quantization_config or hf_quant_config.json, else 16 bits"
    target.add_argument(
        "--weight-format",
        choices=WEIGHT_CHOICES,
        help="the decoder layers' linear weights: fp8 (per tensor), fp8-block (128 x 128 scales), nvfp4 "
        f"(Blackwell), or bf16/fp16 (unquantized; {declared})",
    )
    target.add_argument(
        "--kv-cache-dtype", choices=KV_CHOICES, help=f"the KV cache: fp8, or bf16/fp16 (the dtype's; {declared})"
    )
    # how a mixture-of-experts model's experts are served (perfmodel.models.moe); a dense model has none
    split = "tp (each expert split), ep (the experts spread) or auto (default: plans try both, a step takes tp)"
    target.add_argument("--moe-parallel", choices=tuple(MoeSplit), help=f"an MoE model's experts under --tp: {split}")
    routed = f"how an MoE model's tokens fall on its experts (default: {DEFAULT_ROUTING}, aiconfigurator's)"
    target.add_argument("--routing", choices=tuple(Routing), help=routed)


# How --help describes each scheme decoder.acceptance knows; a scheme not listed is named as is.
SCHEME_HELP = {
    "greedy": "greedy (lossless: greedy decoding's output)",
    "typical": "typical (the Medusa paper's typical acceptance)",
    "rejection": "rejection (exact sampling)",
}


def acceptance(target: Target, *, choices: Sequence[str]) -> None:
    """--acceptance: the decoder's verification scheme; `choices` come from the command
    (decoder.acceptance.SCHEMES, or the ones it supports)."""
    target.add_argument(
        "--acceptance",
        choices=tuple(choices),
        default="greedy",
        help="the decoder's verification scheme: "
        + ", ".join(SCHEME_HELP.get(c, c) for c in choices)
        + " (default %(default)s)",
    )


def acceptance_rates(target: Target, *, own_record: bool = False) -> None:
    """--acceptance-rates: what the performance model assumes heads accept. None when not
    given, which perfmodel.acceptance.rates.resolve_acceptance reads as paper; with
    own_record the command first takes the --model checkpoint folder's own record."""
    presets = "|".join(ACCEPTANCE_PRESETS)
    first = "the --model checkpoint folder's own record where it has one, else " if own_record else ""
    target.add_argument(
        "--acceptance-rates",
        metavar=f"{presets}|FILE.json",
        help="the performance model's acceptance rates: paper = acc(n) = 0.477 log2(n), the paper's curve; paper-ln "
        f"= the same slope read as ln(n); eagle = EAGLE's, {EAGLE_ACCEPTANCE.formula()} (EAGLE-2 on Spec-Bench: "
        f"{EAGLE_PRESET_TOKENS} tokens/step with {EAGLE_PRESET_TREE} tokens); FILE = a python -m decoder.measure "
        "record (of its fitted a + b ln(n) and its head-accuracy model, the closer to its measurements sizes the "
        "tree; its head accuracies shape it; a record "
        f"of an EAGLE run is EAGLE's curve) (default: {first}paper; EAGLE's: eagle)",
    )


DRAFTER_MEANINGS = {
    "medusa": "the Medusa heads, in the step",
    "eagle": "EAGLE, one layer and the LM head per depth, then the tree verified",
    "draft": "a separate draft model, gamma draft steps then gamma + 1 tokens verified",
    "eagle3": "EAGLE-3's head (3-layer feature fusion, its own vocabulary), from a measured acceptance",
    "mtp": "the checkpoint's own MTP module(s) (num_nextn_predict_layers), from a measured acceptance",
    "ngram": "n-gram lookup in the context on the host (prompt lookup), from a measured acceptance",
    "all": "the three side by side and the best drafter and tree per batch and context",
    "best": "each band runs whichever of the three is best there, or off",
}


def drafter(target: Target, choices: Sequence[str] = (*DRAFTERS, "all")) -> None:
    """--drafter: who drafts the speculative step's tree (perfmodel.planning.drafters); the
    decoder runs the two it implements (medusa, eagle)."""
    meanings = "; ".join(f"{name} = {DRAFTER_MEANINGS[name]}" for name in choices)
    target.add_argument(
        "--drafter",
        choices=tuple(choices),
        default="medusa",
        help=f"who drafts the tree: {meanings} (default %(default)s)",
    )


def out(
    target: Target,
    default: str | None,
    *,
    what: str = "output folder",
    metavar: str = "DIR",
    required: bool = False,
    value: Path | None = None,
) -> None:
    """--out: where the command writes its output; a folder, or for a command whose output
    is one file (metavar FILE...), that file. default: the command's location rule, as
    --help says it (perf-reports/<command>/...); value: the path argparse returns when
    --out is not given (None: the command applies the rule itself)."""
    said = " (required)" if required else f" (default {default})"
    kind = output_file if "FILE" in metavar else output_dir
    target.add_argument(
        "--out", type=kind, default=value, metavar=metavar, **_required(required), help=f"where to write: {what}{said}"
    )


def csv(target: Target, what: str, *, default: str | None = None, required: bool = False) -> None:
    """--csv: a CSV file the command also (or only) writes its table to. default: where the
    table goes without it, as --help says it; None: not written (unless required)."""
    said = f" (default {default})" if default else ""
    target.add_argument(
        "--csv", type=output_file, metavar="FILE", **_required(required), help=f"write {what} to this CSV file{said}"
    )


def output_file(text: str) -> Path:
    """An output file option's value, checked when parsed (perfmodel.base.outputs.preflight):
    a bad one fails in one line before the command does any work."""
    try:
        return preflight(text, "output file", folder=False)
    except PerfkitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def output_dir(text: str) -> Path:
    """An output folder option's value, checked when parsed, nothing created (see output_file)."""
    try:
        return preflight(text, "output folder", folder=True)
    except PerfkitError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def jobs(target: Target) -> None:
    target.add_argument(
        "--jobs", type=job_count, metavar="N", help="processes drawing figures (default and most: one per core)"
    )


def step_point(target: Target, *, tree_default: int | None = None, tree_use: str = "") -> None:
    """One step's shape: the batch, the cached context and the Medusa tree's size.
    `tree_default`: the command's tree when none is given (None: no tree unless asked);
    `tree_use`: what the command does with a tree, said after the shared help."""
    tree = f"tokens of the Medusa step's tree, root included{tree_use}"
    target.add_argument(
        "--tree-size",
        type=token_count,
        default=tree_default,
        metavar="T",
        help=tree + (" (default %(default)s)" if tree_default is not None else ""),
    )
    target.add_argument(
        "--batch", type=batch_size, default=1, metavar="B", help="sequences per step (default %(default)s)"
    )
    target.add_argument(
        "--context",
        type=token_count,
        default=512,
        metavar="S",
        help="tokens each sequence has cached before the step (default %(default)s)",
    )


# What each step flavour of --step prices (perfmodel.planning.step_models builds them).
STEP_FLAVOR_HELP = {
    "paper": "the paper's simplified Llama block (Appendix G.3, reproduces its figures)",
    "full": "the whole model step (all layers, LM head, Medusa heads, verification)",
    "traced": "every kernel the reference decoder's step launches, traced on the meta device and priced one by one "
    "(about 0.04 s per point traced)",
    "both": "paper and full",
    "all": "the three",
}


def step(target: Target, *, choices: Sequence[str], default: str, use: str = "step latency model") -> None:
    """--step: which step flavour(s) the command prices."""
    described = "; ".join(f"{c}{' (default)' if c == default else ''} = {STEP_FLAVOR_HELP[c]}" for c in choices)
    target.add_argument("--step", choices=tuple(choices), default=default, help=f"{use}: {described}")


def twin(target: Target) -> None:
    """A performance twin (decoder.twin): dummy weights, a real run's acceptance replayed."""
    target.add_argument(
        "--weights",
        choices=("real", "dummy"),
        default="real",
        help="real: the checkpoint's weights; dummy: random weights over the model's config.json (any size, no "
        "checkpoint), every step verifying in full and accepting what --replay recorded (default %(default)s)",
    )
    target.add_argument(
        "--replay",
        type=Path,
        metavar="RECORD",
        help="with --weights dummy: a python -m decoder.measure record whose accepted path lengths every tree replays",
    )


def launch(target: Target, *, many: bool = False, default: tuple[str, ...] | None = ("eager",)) -> None:
    """--launch: how a decoding step runs on its device (perfmodel.base.launch.Launch).
    default None: no regime unless asked (a priced step is then its kernels' sum)."""
    several = "; several may be given" if many else ""
    said = " ".join(default) if default else "none: a traced step is priced as its kernels' sum"
    target.add_argument(
        "--launch",
        nargs=_nargs(many),
        default=(list(default) if many else default[0]) if default else None,
        choices=[m.value for m in Launch],
        help="eager: the reference decoder's loop, sequence by sequence; static: the batch's step as tensor ops "
        "launched from Python; graph: that step replayed from a CUDA graph; compiled: through torch.compile "
        f"(default {said}){several}",
    )


def acceleration(target: Target) -> None:
    """A measured acceptance for one tree: the tokens a step yields."""
    target.add_argument(
        "--acceleration",
        type=float,
        metavar="A",
        help="with --tree-size: tokens accepted per step with that tree (e.g. measured by python -m decoder.measure)",
    )


position_rate = number_in(0.0, 1.0, "from 0 to 1 (the share of drafts accepted at that position)")


def position_rates(target: Target, *, use: str) -> None:
    """--position-rates: a chain's measured acceptance, one rate per draft position."""
    target.add_argument(
        "--position-rates",
        type=position_rate,
        nargs="+",
        metavar="R",
        help="a chain's acceptance rate at each draft position (vLLM's /metrics: accepted per position over drafts; "
        f"python -m perfmodel.speedup --metrics PAGE prints them), tokens per step = 1 + their sum; {use}",
    )


def draft_config(target: Target, *, use: str) -> None:
    """--draft-config: the drafter's own config.json (perfmodel.models.drafter_config)."""
    target.add_argument(
        "--draft-config",
        type=Path,
        metavar="PATH",
        help="the drafter's own config.json (a file or its folder): a draft model's (--drafter draft: its own steps "
        "instead of --draft-cost), or an EAGLE / EAGLE-3 head's (its layer shapes; EAGLE-3's draft_vocab_size); an "
        f"MTP module's shapes are the target's own; {use}",
    )


def json_output(target: Target, what: str) -> None:
    """--json: the command's answer as JSON on stdout instead of text."""
    target.add_argument("--json", action="store_true", help=f"print {what} as JSON instead of text")
