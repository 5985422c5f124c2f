"""This decoder's step times by tree size on this machine, for `--tree auto`
(decoder.auto_tree): measured by a quick calibration, checked, then kept and reused
(decoder.calibration_cache).

A calibration decodes a few held-out prompts plainly and with the greedy tree of each
candidate size, interleaved (decoder.runs.decode_interleaved), and keeps seconds per step. It
runs once per machine, model, batch, prompt length (rounded up to a power of two) and response
length, with a progress bar, and is kept for later runs.

Step times taken on a busy machine mislead the choice: a loaded CPU stretched the plain
step 9x and made step times fall as the tree grew, and the tree picked from them ran at
0.77x. So every run first times a few plain steps (the probe), and a calibration is used
only if its step times do not fall as the tree grows and its plain step is not much slower
than the probe's (plausibility checks, below). A cached calibration that fails them is
measured again; a fresh one that fails them is neither kept nor used. `--recalibrate`
measures it again regardless; deleting the cache file does the same.

A calibration takes seconds to minutes on 2 cores, so only a run that asks for one measures
it (Measuring).
"""

from __future__ import annotations

import time
from enum import Enum

import numpy as np
import torch
from tqdm import tqdm

from decoder.acceptance import AcceptanceConfig
from decoder.calibration_cache import cache_folder, calibration_for, context_bucket
from decoder.checkpoint import Checkpoint
from decoder.medusa import Decoder
from decoder.runs import decode_interleaved, heldout_prompts, warm_up
from decoder.step_profile import PLAIN_STEP_FACTOR, StepProfile, profile_problems, unsteady_rounds
from decoder.tree import Drafting
from perfmodel.acceptance.trees import greedy_tree
from perfmodel.base.errors import PerfkitError
from perfmodel.models.operators import HEAD_TOP_K

CALIBRATION_SIZES = (1, 2, 4, 8, 16, 32, 64)
# Batches of prompts per size and round. With 2, one tree size's step over the plain step
# scattered by +-10% from one calibration to the next on a 2-core VM (two threads), enough to
# pick plain decoding where a tree was 6% faster; 4 halves the variance.
CALIBRATION_PROMPTS = 4
# Rounds over the prompts, every size in each; the median round is kept (calibrate): on a
# shared VM one round in three or four meets a burst of load.
CALIBRATION_ROUNDS = 5
# Tokens each calibration run decodes: a step's time depends on its context, not on how many
# steps follow, so the runs start their prompts where the real run's steps are on average and
# decode a few dozen tokens. Decoding the run's own count (200 by default) took minutes.
CALIBRATION_TOKENS = 32
PROBE_STEPS = 8  # plain steps per probe: a few milliseconds on the bundled model
PROBE_REPEATS = 3  # the probe's time is the fastest of these: interference only ever slows a run down


def calibration_prompt_len(ckpt: Checkpoint, prompt_len: int, new_tokens: int) -> int:
    """Calibration prompts are `prompt_len` rounded up to a power of two, cut so that prompt and
    response fit the model's context window."""
    room = ckpt.config.max_position_embeddings - new_tokens
    if room < 1:
        raise PerfkitError(
            f"{new_tokens} new tokens leave no room for a prompt in the model's context of "
            f"{ckpt.config.max_position_embeddings} tokens (max_position_embeddings)"
        )
    return min(context_bucket(prompt_len), room)


def age_text(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def probe_plain_step(decoder: Decoder, prompts: list[list[int]]) -> float:
    """Seconds per plain decoding step on this machine now: the fastest of a few short runs
    after a warm-up (the first calls of every kernel are slow)."""
    kwargs = dict(acceptance=AcceptanceConfig("greedy"))
    decoder.generate(prompts, 2, **kwargs)
    runs = [decoder.generate(prompts, PROBE_STEPS, **kwargs) for _ in range(PROBE_REPEATS)]
    return min(r.decode_s / r.steps for r in runs)


def calibrate(
    decoder: Decoder, ckpt: Checkpoint, batch: int, prompt_len: int, new_tokens: int, accuracy, log=print, sizes=None
) -> dict[str, dict[int, float]]:
    """Time this decoder's steps with plain decoding and the greedy tree of every candidate
    size (`sizes`, plain decoding's 1 among them; default CALIBRATION_SIZES), interleaved, at
    `batch` prompts of about `prompt_len` tokens each decoding `new_tokens`: CALIBRATION_TOKENS
    of them, from prompts longer by half the rest, so the steps see the run's mean context.
    Returns seconds per step (the median round's), the batch efficiency (tokens per sequence
    and step over the tokens each active sequence accepted per step) and the spread of the
    rounds (upper quartile over lower, less 1), per tree size."""
    heads = len(ckpt.heads)
    if sizes is None:
        sizes = [n for n in CALIBRATION_SIZES if n == 1 or n - 1 <= heads * HEAD_TOP_K]
    elif 1 not in sizes:
        raise PerfkitError(f"calibration sizes need plain decoding (size 1); got {list(sizes)}")
    settings = {n: {"drafting": Drafting(greedy_tree(accuracy, n - 1) if n > 1 else None)} for n in sizes}
    decoded = min(new_tokens, CALIBRATION_TOKENS)
    room = ckpt.config.max_position_embeddings - decoded
    length = min(calibration_prompt_len(ckpt, prompt_len, new_tokens) + (new_tokens - decoded) // 2, room)
    prompts = heldout_prompts(ckpt, batch * CALIBRATION_PROMPTS, length, seed=1)
    log(
        f"calibrating the decoder's step time on this machine (batch {batch}, prompts of {length} tokens, "
        f"tree sizes {', '.join(map(str, sizes))})"
    )
    kwargs = dict(acceptance=AcceptanceConfig("greedy"))
    # every size warm at the shapes it is timed at, untimed: the first plain run of a cold
    # calibration took 3x the rest and condemned it (decoder.runs.warm_up)
    warm_up(decoder, prompts, batch, decoded, settings, **kwargs)
    steps = {n: 0 for n in sizes}
    tokens = {n: 0 for n in sizes}
    accepted = {n: [] for n in sizes}
    per_round = {n: [] for n in sizes}  # seconds per step of each round
    with tqdm(total=CALIBRATION_ROUNDS * CALIBRATION_PROMPTS, desc="calibrating", unit="batch", leave=False) as bar:
        for turn in range(CALIBRATION_ROUNDS):
            # one call a round: the sizes' order rotates from batch to batch of prompts, and each
            # round starts one size later, so that no size always follows the same one
            order = sizes[turn % len(sizes) :] + sizes[: turn % len(sizes)]
            rotated = {n: settings[n] for n in order}
            runs = decode_interleaved(decoder, prompts, batch, decoded, rotated, 1, progress=bar.update, **kwargs)
            for n, result in runs.items():
                steps[n] += result.steps
                tokens[n] += result.new_tokens
                accepted[n] += [a for row in result.accepted for a in row]
                per_round[n].append(result.decode_s / result.steps)
    # The median round, and the spread of the middle rounds (upper quartile over lower): a round
    # lasts a fraction of a second a size, and one burst of a shared machine's load in it
    # stretched that size's mean by 40% where the other rounds agreed within 10%. The median and
    # the quartiles of five rounds ride out one such round at either end; the machine changing
    # speed for longer still spreads the quartiles. (Slowest over fastest grows with the rounds.)
    return {
        "step_s": {n: float(np.median(times)) for n, times in per_round.items()},
        "batch_efficiency": {n: tokens[n] / (steps[n] * batch) / np.mean(accepted[n]) for n in sizes},
        "spread": {n: float(np.percentile(times, 75) / np.percentile(times, 25)) - 1 for n, times in per_round.items()},
    }


# A calibration is measured again once where the first comes out implausible: a burst of a
# shared machine's load spoils one, and one spoiled left the run with no choice at all.
CALIBRATION_ATTEMPTS = 2


class Measuring(Enum):
    """When a run measures the calibration: never (a kept one or none: generate without
    --tree), where none kept fits (--tree auto), or again whatever is kept (--recalibrate)."""

    NEVER = "never"
    IF_NEEDED = "if needed"
    AGAIN = "again"

    @classmethod
    def asked(cls, recalibrate: bool, may_calibrate: bool) -> Measuring:
        return cls.AGAIN if recalibrate else cls.IF_NEEDED if may_calibrate else cls.NEVER


def step_profile(
    decoder: Decoder,
    ckpt: Checkpoint,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    accuracy,
    log=print,
    measuring: Measuring = Measuring.IF_NEEDED,
) -> tuple[StepProfile | None, str]:
    """This decoder's step times by tree size, as (the profile, where it is kept): the cached
    calibration where it passes the plausibility checks against a fresh probe of the plain
    step, else, unless `measuring` is NEVER, measured now and kept where the new one passes
    them (AGAIN: measured whatever is kept). (None, why) where no kept calibration passes them:
    one that is not kept is not used."""
    calibration = calibration_for(ckpt, decoder, batch, prompt_len, new_tokens)
    recalibrate = measuring is Measuring.AGAIN
    may_calibrate = measuring is not Measuring.NEVER
    length = calibration_prompt_len(ckpt, prompt_len, new_tokens)
    cached = None if recalibrate else calibration.load(log)
    if cached is None and not may_calibrate:
        return None, "no calibration of this machine's step times is kept (--tree auto measures one and keeps it)"
    if cached is None:
        cache_folder(calibration)  # the calibration ahead will be kept there: fail now, not after it
    # The probe runs at the calibration's mean context: its prompts plus half the response.
    probe_len = min(length + new_tokens // 2, ckpt.config.max_position_embeddings - PROBE_STEPS - 2)
    probe_prompts = heldout_prompts(ckpt, batch, probe_len, seed=2)
    probe_s = probe_plain_step(decoder, probe_prompts)
    if cached is not None:
        problems = profile_problems(cached, probe_s)
        if not problems:
            measured_at = cached.measured_at
            age = "of unknown age" if measured_at is None else f"{age_text(time.time() - measured_at)} old"
            log(
                f"using the tree calibration {calibration.path} [{calibration.key}], {age}; --recalibrate measures it "
                "again"
            )
            if probe_s > PLAIN_STEP_FACTOR * cached.plain_s:
                log(
                    f"this machine is slower now than when calibrated (plain step {probe_s * 1e3:.3g} ms against "
                    f"{cached.plain_s * 1e3:.3g} ms): busy? The calibration is kept; this run's timings will be slow"
                )
            return cached, calibration.describe()
        log(f"not using the tree calibration {calibration.path} [{calibration.key}]: {'; '.join(problems)}")
        if not may_calibrate:
            return None, "the kept calibration does not fit this machine now, as said (--tree auto measures it again)"
    elif recalibrate:
        log("--recalibrate: measuring the tree calibration again")
    cache_folder(calibration)
    for attempt in range(1, CALIBRATION_ATTEMPTS + 1):
        if attempt > 1:  # the machine now, not as it was before the failed attempt
            probe_s = probe_plain_step(decoder, probe_prompts)
        measured = calibrate(decoder, ckpt, batch, prompt_len, new_tokens, accuracy, log)
        fresh = StepProfile(measured["step_s"], measured["batch_efficiency"], time.time(), torch.__version__)
        problems = profile_problems(fresh, probe_s) + [p for p in [unsteady_rounds(measured.get("spread"))] if p]
        if probe_s > PLAIN_STEP_FACTOR * fresh.plain_s:
            problems.append(
                f"its plain step ({fresh.plain_s * 1e3:.3g} ms) is far below the probe's ({probe_s * 1e3:.3g} ms)"
            )
        if not problems:
            break
        again = "measuring it once more" if attempt < CALIBRATION_ATTEMPTS else "it is neither kept nor used"
        log(
            f"the new tree calibration is implausible ({'; '.join(problems)}): the machine's speed changed while it "
            f"ran (is it busy?); {again}"
        )
    if problems:
        return None, "the calibration measured now is implausible, as said above"
    calibration.save(fresh)
    log(f"kept the tree calibration in {calibration.path} [{calibration.key}]")
    return fresh, calibration.describe()
