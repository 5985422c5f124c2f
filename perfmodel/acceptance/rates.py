"""How many tokens a speculative step accepts: fits and models of the acceleration rate.

- `LogAcceptance`: acc(n) = a + b log(n) over the tree size n (tokens per step, root
  included), fitted with scipy to measured (tree size, tokens per step) pairs (natural
  log), or the paper's preset 0.477 log2(n) (Appendix G.3, no intercept). The paper names
  no base; its own measurements decide log2 (docs/acceptance.md). The natural-log reading
  stays available as the preset "paper-ln".
- `HeadAccuracyAcceptance`: the expected acceptance of the best tree of n tokens built
  from measured head accuracies a_k^(i) (paper 2.3.3), for any n.
- `draft_model_tokens` / `draft_model_improvement`: speculative decoding with a separate
  draft model (Leviathan et al.), for comparison.
- `resolve_acceptance`: the one policy for what an acceptance setting means (a preset name
  of ACCEPTANCE_PRESETS or None, a decoder.measure record, or a model from Python), as an
  `AcceptanceChoice`; `drafter_acceptances` gives each drafter its own (a setting is of one
  drafter: Medusa's heads, or EAGLE's, `EAGLE_ACCEPTANCE` its published preset).

Every model is a callable n -> tokens per step (arrays welcome), never below 1: the
root, the model's own next token, is always accepted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from perfmodel.acceptance.record import AcceptanceRecord
from perfmodel.acceptance.trees import expected_acceptance, greedy_tree, optimal_tree
from perfmodel.base.drafter_kind import DrafterKind
from perfmodel.base.errors import PerfkitError

PAPER_LOG_SLOPE = 0.477  # Medusa paper, Appendix G.3: acc_rate = 0.477 log(num_candidates)
# The paper names no base. log2 is the reading its measurements support (docs/acceptance.md):
# 0.477 log2(64) = 2.86 tokens/step against 2.3-2.5 (Medusa-1) and 3.47 (Medusa-2) measured.
PAPER_LOG_BASE = 2.0

# An acceptance model: tree sizes, root included (an int or an array of them) -> tokens per step;
# a LogAcceptance, a HeadAccuracyAcceptance, a planner's table of one, or any callable given.
AcceptanceModel = Callable[[int | np.ndarray], np.ndarray]


def check_sizes(n) -> np.ndarray:
    n = np.asarray(n)
    if n.dtype.kind not in "iuf" or (n < 1).any():
        raise PerfkitError(
            f"tree sizes must be numbers >= 1 (tokens per step, root included), got {n.ravel()[:5].tolist()}"
        )
    return n


@dataclass(frozen=True)
class FitError:
    """How far a fit is from the measurements it came from."""

    points: int
    mean_abs_pct: float  # mean |fit - measured| / measured, in percent
    max_abs_pct: float
    r2: float

    def __str__(self) -> str:
        return (
            f"{self.points} points, mean error {self.mean_abs_pct:.1f}%, max {self.max_abs_pct:.1f}%, R^2 {self.r2:.3f}"
        )


def fit_error(predicted, measured) -> FitError:
    predicted, measured = np.asarray(predicted, float), np.asarray(measured, float)
    rel = np.abs(predicted - measured) / measured * 100
    spread = ((measured - measured.mean()) ** 2).sum()
    r2 = 1 - ((predicted - measured) ** 2).sum() / spread if spread > 0 else float("nan")
    return FitError(len(measured), float(rel.mean()), float(rel.max()), float(r2))


def log_name(base: float) -> str:
    """How a formula writes the log of a base: ln, log2, log10, else log_<base>."""
    if base == math.e:
        return "ln"
    return {2.0: "log2", 10.0: "log10"}.get(float(base), f"log_{base:g}")


@dataclass(frozen=True)
class LogAcceptance:
    """acc(n) = a + b log_base(n), at least 1 (base e unless given)."""

    a: float
    b: float
    label: str = ""
    error: FitError | None = None  # against the measurements it was fitted to
    base: float = math.e

    def __post_init__(self) -> None:
        if not (isinstance(self.base, (int, float)) and self.base > 1 and math.isfinite(self.base)):
            raise PerfkitError(f"a log acceptance curve's base must be a finite number > 1, got {self.base!r}")

    def __call__(self, n) -> np.ndarray:
        return np.maximum(1.0, self.unclamped(n))

    def unclamped(self, n) -> np.ndarray:
        """a + b log(n) without the floor: below 1 token per step where n is small."""
        return self.a + self.b * np.log(check_sizes(n)) / math.log(self.base)

    def clamped_below(self) -> float:
        """The tree size under which a + b log(n) < 1, where the curve is held at 1 (1 if never):
        base^((1 - a) / b)."""
        return float(self.base ** ((1.0 - self.a) / self.b)) if self.b > 0 and self.a < 1 else 1.0

    def formula(self) -> str:
        """The right-hand side, e.g. '0.477 log2(n)' or '1.135 + 0.404 ln(n)'."""
        term = f"{self.b:.3f} {log_name(self.base)}(n)"
        return f"{self.a:.3f} + {term}" if self.a else term

    def describe(self) -> str:
        text = f"acc(n) = {self.formula()}"
        return f"{text} ({self.label}; {self.error})" if self.error else f"{text} ({self.label})"


PAPER_ACCEPTANCE = LogAcceptance(0.0, PAPER_LOG_SLOPE, "Medusa paper Appendix G.3 preset", base=PAPER_LOG_BASE)
# The same slope read as a natural log: 1.98 tokens/step at 64 tokens, below every
# acceptance the paper measured; kept by name ("paper-ln") to compare with.
PAPER_LN_ACCEPTANCE = LogAcceptance(
    0.0, PAPER_LOG_SLOPE, "Medusa paper Appendix G.3 slope read as a natural log", base=math.e
)


# EAGLE-2 (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft
# Trees") measured by Spec-Bench (github.com/hemingkx/Spec-Bench, Leaderboard.md, "Leaderboard on
# 3090": Vicuna-7B-v1.3, greedy, fp16, batch 1, mean of its six tasks): 4.35 mean accepted tokens
# per step, root included, with the settings of its evaluation/inference_eagle2.py: total_token 60
# (59 drafts and the root: 60 tokens verified), depth 5 (6 draft passes: 6 levels), top_k 10.
# One point fixes a log curve through the origin, the form of the Medusa paper's preset:
# b = 4.35 / log2(60) = 0.736. The same leaderboard measures Medusa-1 (its 64-token tree) at
# 2.32 tokens per step, where the Medusa paper's preset says 0.477 log2(64) = 2.86.
EAGLE_PRESET_TREE = 60
EAGLE_PRESET_TOKENS = 4.35
EAGLE_ACCEPTANCE = LogAcceptance(
    0.0,
    EAGLE_PRESET_TOKENS / math.log2(EAGLE_PRESET_TREE),
    f"EAGLE-2 on Spec-Bench preset: {EAGLE_PRESET_TOKENS} tokens/step with {EAGLE_PRESET_TREE} tokens, Vicuna-7B",
    base=2.0,
)


def fit_log_acceptance(sizes, tokens_per_step, intercept: bool = True, label: str = "fitted") -> LogAcceptance:
    """Least-squares fit of a + b ln(n) (b ln(n) with intercept=False) to measured pairs."""
    from scipy.optimize import curve_fit

    n = check_sizes(np.asarray(sizes, dtype=float))
    acc = np.asarray(tokens_per_step, dtype=float)
    if n.shape != acc.shape or n.ndim != 1:
        raise PerfkitError(f"need one tokens-per-step value per tree size, got {n.size} sizes and {acc.size} values")
    if (acc < 1).any():
        raise PerfkitError(f"tokens per step are >= 1 (the root is always accepted), got {acc.min()}")
    needed = 2 if intercept else 1
    if len(set(n.tolist())) < needed:
        raise PerfkitError(
            f"fitting a + b ln(n) needs at least {needed} distinct tree sizes, got {sorted(set(n.tolist()))}"
        )
    if intercept:
        (a, b), _ = curve_fit(lambda x, a, b: a + b * np.log(x), n, acc, p0=(1.0, 0.5))
    else:
        (b,), _ = curve_fit(lambda x, b: b * np.log(x), n, acc, p0=(0.5,))
        a = 0.0
    model = LogAcceptance(float(a), float(b), label)
    return LogAcceptance(model.a, model.b, label, fit_error(model(n), acc))


@dataclass(frozen=True)
class HeadAccuracyAcceptance:
    """Tokens per step of the best n-token tree built from head accuracies a_k^(i).

    `exact` picks the dynamic-programming optimum, else the paper's greedy tree (the two
    agree under the independence model; perfmodel.acceptance.trees has both)."""

    accuracy: np.ndarray = field(repr=False)
    exact: bool = False
    label: str = "head-accuracy model"
    error: FitError | None = None
    # tokens per step by tree size: each size builds a tree, too slow to redo per configuration
    _known: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        acc = np.asarray(self.accuracy, dtype=float)
        if acc.ndim != 2 or (acc < 0).any() or (acc > 1).any():
            raise PerfkitError("head accuracies must be a (heads, topk) array of probabilities in [0, 1]")
        object.__setattr__(self, "accuracy", acc)

    def tree(self, n: int):
        build = optimal_tree if self.exact else greedy_tree
        return build(self.accuracy, int(n) - 1)

    def __call__(self, n) -> np.ndarray:
        n = check_sizes(n)
        for size in {int(x) for x in np.ravel(n)} - self._known.keys():
            self._known[size] = expected_acceptance(self.tree(size), self.accuracy)
        flat = [self._known[int(x)] for x in np.ravel(n)]
        return np.asarray(flat, dtype=float).reshape(np.shape(n))

    def checked_against(self, sizes, tokens_per_step) -> HeadAccuracyAcceptance:
        """This model with its error against measured (tree size, tokens per step) pairs."""
        return HeadAccuracyAcceptance(
            self.accuracy, self.exact, self.label, fit_error(self(np.asarray(sizes)), tokens_per_step)
        )

    def describe(self) -> str:
        heads, topk = self.accuracy.shape
        text = f"best tree from measured accuracies of {heads} heads x top-{topk}"
        return f"{text} ({self.error})" if self.error else text


def draft_model_tokens(alpha, gamma) -> np.ndarray:
    """Expected tokens per step with a draft model: (1 - alpha^(gamma+1)) / (1 - alpha)."""
    alpha, gamma = np.asarray(alpha, dtype=float), np.asarray(gamma)
    if ((alpha < 0) | (alpha > 1)).any():
        raise PerfkitError(f"acceptance rate alpha must be in [0, 1], got {alpha.ravel()[:3].tolist()}")
    if (gamma < 0).any():
        raise PerfkitError(f"drafted tokens gamma must be >= 0, got {np.ravel(gamma)[:3].tolist()}")
    with np.errstate(divide="ignore", invalid="ignore"):
        tokens = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return np.where(alpha >= 1, gamma + 1.0, tokens)


def draft_model_improvement(alpha, gamma, cost_ratio) -> np.ndarray:
    """Walltime improvement E / (c gamma + 1), c = draft step cost / target step cost."""
    c = np.asarray(cost_ratio, dtype=float)
    if (c < 0).any():
        raise PerfkitError(f"draft cost ratio c must be >= 0, got {c.ravel()[:3].tolist()}")
    return draft_model_tokens(alpha, gamma) / (c * np.asarray(gamma) + 1)


def closer_to_record(log: LogAcceptance, heads: HeadAccuracyAcceptance):
    """Of a record's two models, the one with the smaller mean error against its measured
    tokens per step: the one every prediction from that record uses."""
    return heads if heads.error.mean_abs_pct < log.error.mean_abs_pct else log


def models_from_record(record: AcceptanceRecord) -> tuple[LogAcceptance, HeadAccuracyAcceptance]:
    """The log fit and the head-accuracy model of a decoder.measure record, each with its
    error against the record's measured tokens per step per tree size."""
    sizes, measured = record.tree_sizes, record.tokens_per_step
    log = fit_log_acceptance(sizes, measured, label="fitted to decoder.measure")
    heads = HeadAccuracyAcceptance(np.asarray(record.head_topk_accuracy)).checked_against(sizes, measured)
    return log, heads


@dataclass(frozen=True)
class AcceptanceChoice:
    """The acceptance model the speedups use, what builds the tree of a size (a
    HeadAccuracyAcceptance from a measured record; None for the paper's preset), and the
    log curve a + b log n (the paper's preset, or the record's fit)."""

    model: AcceptanceModel
    label: str
    trees: HeadAccuracyAcceptance | None = None
    log: LogAcceptance | None = None
    record: AcceptanceRecord | None = field(default=None, repr=False, compare=False)  # the decoder.measure record
    drafter: str = "medusa"  # whose trees it describes (RECORD_DRAFTERS): the Medusa heads' or EAGLE's

    @property
    def curve(self):
        """The log curve, whether or not the speedups use it."""
        return self.log if self.log is not None else self.model


# What an acceptance setting may be (resolve_acceptance reads each): a preset's name or a
# decoder.measure record's path, an acceptance model, a choice already made, or None (the preset).
AcceptanceSetting = str | Path | AcceptanceModel | AcceptanceChoice | None


def describe_acceptance(model) -> str:
    """What an acceptance model says of itself: describe(), else its label, else its repr."""
    return model.describe() if hasattr(model, "describe") else getattr(model, "label", None) or repr(model)


PAPER_CHOICE = AcceptanceChoice(PAPER_ACCEPTANCE, PAPER_ACCEPTANCE.describe(), log=PAPER_ACCEPTANCE)
PAPER_LN_CHOICE = AcceptanceChoice(PAPER_LN_ACCEPTANCE, PAPER_LN_ACCEPTANCE.describe(), log=PAPER_LN_ACCEPTANCE)
EAGLE_CHOICE = AcceptanceChoice(EAGLE_ACCEPTANCE, EAGLE_ACCEPTANCE.describe(), log=EAGLE_ACCEPTANCE, drafter="eagle")
# The names an acceptance setting may give instead of a decoder.measure record.
ACCEPTANCE_PRESETS = {"paper": PAPER_CHOICE, "paper-ln": PAPER_LN_CHOICE, "eagle": EAGLE_CHOICE}
# Each drafter's acceptance where no setting of its own is given.
DRAFTER_PRESETS = {"medusa": "paper", "eagle": "eagle"}


def resolve_acceptance(acceptance=None) -> AcceptanceChoice:
    """What an acceptance setting (`--acceptance paper|paper-ln|FILE.json`, or a Python value) means:

    - "paper" or None: the paper's preset 0.477 log2 n; "paper-ln": 0.477 ln n; "eagle":
      EAGLE's preset, an EAGLE choice (ACCEPTANCE_PRESETS);
    - a decoder.measure JSON record (a str or Path): of its log fit a + b ln n and its
      head-accuracy model, the one closer to the record's measurements (closer_to_record)
      sizes the tree; the record's head accuracies shape it;
    - an acceptance model (a callable tree size -> tokens per step): used as is (it shapes
      trees too where it is a HeadAccuracyAcceptance);
    - an AcceptanceChoice: itself.
    """
    if isinstance(acceptance, AcceptanceChoice):
        return acceptance
    if acceptance is None:
        return PAPER_CHOICE
    if isinstance(acceptance, str) and acceptance in ACCEPTANCE_PRESETS:
        return ACCEPTANCE_PRESETS[acceptance]
    if isinstance(acceptance, (str, Path)):
        if not Path(acceptance).exists():
            raise PerfkitError(
                f"cannot read acceptance record {acceptance}: no such file; give a decoder.measure record or a "
                f"preset ({', '.join(ACCEPTANCE_PRESETS)})"
            )
        return record_choice(acceptance)
    if not callable(acceptance):
        raise PerfkitError(
            f"acceptance must be a preset ({', '.join(ACCEPTANCE_PRESETS)}), a decoder.measure JSON path or an "
            f"acceptance model, got {acceptance!r}"
        )
    return AcceptanceChoice(
        acceptance,
        describe_acceptance(acceptance),
        trees=acceptance if isinstance(acceptance, HeadAccuracyAcceptance) else None,
        log=acceptance if isinstance(acceptance, LogAcceptance) else None,
    )


def drafter_acceptances(setting, drafters) -> dict[str, AcceptanceChoice]:
    """Each drafter's acceptance (drafters: keys of DRAFTER_PRESETS): the setting's
    (resolve_acceptance) for the drafter it is of, DRAFTER_PRESETS' for the others; a setting
    of none of them is an error."""
    given = None if setting is None else resolve_acceptance(setting)
    if given is not None and given.drafter not in drafters:
        raise PerfkitError(
            f"acceptance {setting} is of the {given.drafter} drafter, not of {' or '.join(drafters)}: give one of "
            f"theirs ({', '.join(n for n, c in ACCEPTANCE_PRESETS.items() if c.drafter in drafters)}, or a record)"
        )
    return {
        d: given if given is not None and given.drafter == d else ACCEPTANCE_PRESETS[DRAFTER_PRESETS[d]]
        for d in drafters
    }


def medusa_acceptance(setting) -> AcceptanceChoice:
    """The Medusa heads' acceptance of a setting (resolve_acceptance; None: the paper's preset).
    Another drafter's record or preset (EAGLE's) is refused in one line: its curve is not the
    heads'."""
    return drafter_acceptances(setting, ("medusa",))["medusa"]


def record_choice(path) -> AcceptanceChoice:
    """The acceptance of a decoder.measure record at `path` (see resolve_acceptance). An
    EAGLE record (its `drafter`) has no heads: its log fit is its curve."""
    record = AcceptanceRecord.load(path)
    if record.drafter != DrafterKind.MEDUSA:
        try:
            log = fit_log_acceptance(record.tree_sizes, record.tokens_per_step, label="fitted to decoder.measure")
        except PerfkitError as exc:
            raise PerfkitError(f"{path}: {exc}") from None
        label = f"{log.describe()} from {Path(path).name} ({record.drafter})"
        return AcceptanceChoice(log, label, None, log, record, record.drafter)
    try:
        log, heads = models_from_record(record)
    except PerfkitError as exc:
        raise PerfkitError(f"{path}: {exc}") from None
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
        raise PerfkitError(f"{path}: not a usable decoder.measure record ({type(exc).__name__}: {exc})") from None
    used = closer_to_record(log, heads)
    other = heads if used is log else log
    other_name = "head-accuracy model" if other is heads else f"log fit {log.formula()}"
    label = (
        f"{used.describe()} from {Path(path).name}; closer to the record than its {other_name} "
        f"({other.error.mean_abs_pct:.1f}% mean error)"
    )
    return AcceptanceChoice(used, label, heads, log, record)
