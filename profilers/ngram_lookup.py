"""python -m profilers.ngram_lookup: what n-gram (prompt-lookup) drafting costs this host, in
seconds per sequence per step, timed with a real proposer on real token histories.

N-gram drafting runs no GPU work: each step, for each sequence, the host looks the end of the
sequence's token history up in the history itself (decoder.ngram, vLLM's NgramProposer in
numpy) and proposes the tokens that followed. Its cost grows with the history's length.

The text: the held-out files of the bundled model's offline corpus (decoder.corpus: the
standard library's source, 5% of its files by a hash of their paths), encoded with the
bundled model's tokenizer (decoder/assets/bundled/tokenizer.json), in path order and joined
by its end-of-text token into one stream, as long as the longest context needs: contexts
longer than one file are files concatenated. Where the held-out files run out before that,
the stream is repeated whole, and the metadata says so (`repeated`); a repeated stream finds
longer matches than fresh text would.

Method: per (context, k), `--sequences` histories of `context` tokens cut from the stream at
evenly spread offsets, a step's batch; each call proposes for all of them
(decoder.ngram.propose_batch), then every history moves on one token (the next step's),
`--calls` calls timed one by one with time.perf_counter after a warm-up outside the timed
region, Python's garbage collector off while timing. A call's time over the sequences is one
sample of seconds per sequence per step; the CSV holds their median and 90th percentile and
the share of lookups that proposed a token (matched_share).

The CSV (columns: perfmodel.measured.ngram_host.COLUMNS, which reads it back) goes to --out,
by default perf-reports/ngram-lookup/<host>.csv (<host>: this CPU's key), its metadata beside
it (FILE.meta.json: the CPU, Python, numpy, the UTC time, the text used); --store keeps a
copy as this host's stored measurement, where perfmodel.measured.ngram_host finds it.
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from decoder.corpus import EOS, split_corpus
from decoder.ngram import NgramSettings, propose_batch
from perfmodel.base.errors import PerfkitError
from perfmodel.base.outputs import writable_file, write_csv, write_file
from perfmodel.base.paths import TOOLKIT_ROOT
from perfmodel.cli import Parser, batch_size, options, positive_int, run, token_count
from perfmodel.cli.fields import add_options, option, read_options, shared
from perfmodel.hardware.cpu_identity import cpu_model_name, this_cpu_key
from perfmodel.measured import ngram_host as columns
from perfmodel.measured.store import meta_path, user_measurements_dir
from perfmodel.models.config import BUNDLED_MODEL

CONTEXTS, QUICK_CONTEXTS = (256, 1024, 4096, 16384, 32768), (256, 1024)
KS, QUICK_KS = (1, 3, 5, 8), (1, 3)
CALLS, QUICK_CALLS = 1000, 20
SEQUENCES, QUICK_SEQUENCES = 8, 4
WARMUP = 20
MIN_N, MAX_N = columns.LOOKUP_N  # the range the exports state (perfmodel.measured.ngram_host)
DEFAULT_OUT = "perf-reports/ngram-lookup/<host>.csv"
TOKENIZER = BUNDLED_MODEL / "tokenizer.json"


@dataclass(frozen=True)
class LookupPlan:
    """What one run times: each context with each k, for one (min_n, max_n)."""

    contexts: tuple[int, ...] = CONTEXTS
    ks: tuple[int, ...] = KS
    min_n: int = MIN_N
    max_n: int = MAX_N
    calls: int = CALLS
    sequences: int = SEQUENCES

    def settings(self) -> list[NgramSettings]:
        """Each k's settings, checked (a bad min_n, max_n or k is a one-line PerfkitError)."""
        return [NgramSettings(self.min_n, self.max_n, k) for k in self.ks]

    def stream_tokens(self) -> int:
        """Tokens the stream needs: the longest context twice over (windows at spread offsets),
        and one more per call, warm-up calls included (each moves the histories on one token)."""
        return 2 * max(self.contexts) + WARMUP + self.calls + self.sequences


def real_token_stream(needed: int) -> tuple[np.ndarray, dict]:
    """The held-out files encoded with the bundled tokenizer, in path order, joined by the
    end-of-text token, until `needed` tokens (module doc), and what it is (for the metadata)."""
    from tokenizers import Tokenizer

    if not TOKENIZER.is_file():
        raise PerfkitError(f"{TOKENIZER}: no tokenizer (the bundled model's; `python -m decoder.train` makes it)")
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    eos = tokenizer.token_to_id(EOS)
    _, heldout, corpus = split_corpus()
    parts, total, used = [], 0, 0
    for text in heldout:
        ids = tokenizer.encode(text).ids + ([eos] if eos is not None else [])
        parts.append(np.asarray(ids, dtype=np.int32))
        total, used = total + len(ids), used + 1
        if total >= needed:
            break
    stream = np.concatenate(parts)
    repeated = len(stream) < needed
    if repeated:
        stream = np.tile(stream, math.ceil(needed / len(stream)))
    about = {
        "what": f"held-out files of decoder.corpus (the standard library's source), in path order, joined by {EOS}"
        + (", the whole stream repeated to reach the longest context" if repeated else ""),
        "tokenizer": TOKENIZER.relative_to(TOOLKIT_ROOT).as_posix(),
        "corpus_root": corpus["root"],
        "corpus_files_sha1": corpus["file_list_sha1"],
        "files_used": used,
        "stream_tokens": int(len(stream)),
        "repeated": repeated,
    }
    return stream, about


def time_point(stream: np.ndarray, context: int, settings: NgramSettings, calls: int, sequences: int) -> dict:
    """One CSV row: `calls` steps of `sequences` histories of `context` tokens timed (module
    doc). The caller turns the garbage collector off."""
    spread = (len(stream) - context - calls - WARMUP) // sequences
    if spread < 1:
        raise PerfkitError(f"a stream of {len(stream)} tokens is too short for {sequences} histories of {context}")
    starts = np.arange(sequences) * spread
    for step in range(WARMUP):
        propose_batch([stream[s + step : s + step + context] for s in starts], settings)
    samples = np.empty(calls)
    matched = 0
    for call in range(calls):
        at = WARMUP + call
        histories = [stream[s + at : s + at + context] for s in starts]
        begin = time.perf_counter()
        proposals = propose_batch(histories, settings)
        samples[call] = (time.perf_counter() - begin) / sequences
        matched += sum(1 for proposal in proposals if proposal.size)
    return {
        columns.CONTEXT: context,
        columns.K: settings.k,
        columns.MIN_N: settings.min_n,
        columns.MAX_N: settings.max_n,
        columns.SECONDS_MEDIAN: float(np.median(samples)),
        columns.SECONDS_P90: float(np.percentile(samples, 90)),
        columns.CALLS: calls,
        columns.MATCHED_SHARE: round(matched / (calls * sequences), 4),
    }


def measure_ngram_lookup(plan: LookupPlan, progress: bool = False) -> tuple[pd.DataFrame, dict]:
    """The table (perfmodel.measured.ngram_host.COLUMNS) and metadata of one run on this host."""
    from tqdm import tqdm

    settings = plan.settings()
    stream, text = real_token_stream(plan.stream_tokens())
    load = os.getloadavg()[0]  # other work on the machine when the timing starts skews the times
    rows = []
    bar = tqdm(
        total=len(plan.contexts) * len(settings), unit="point", disable=None if progress else True, file=sys.stderr
    )
    collecting = gc.isenabled()
    gc.disable()
    try:
        for context in plan.contexts:
            for each in settings:
                rows.append(time_point(stream, context, each, plan.calls, plan.sequences))
                bar.update()
    finally:
        bar.close()
        if collecting:
            gc.enable()
    meta = {
        columns.META_HOST: this_cpu_key(),
        columns.META_CPU: cpu_model_name(),
        "cores": os.cpu_count(),
        "load_average_1min": round(load, 2),
        "python": platform.python_version(),
        "numpy": np.__version__,
        columns.META_MEASURED: datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "proposer": "decoder.ngram.propose_batch (numpy, one thread; vLLM's NgramProposer's lookup)",
        "calls": plan.calls,
        "sequences": plan.sequences,
        "warmup_calls": WARMUP,
        "text": text,
    }
    return pd.DataFrame(rows, columns=list(columns.COLUMNS)), meta


def write_measurement(table: pd.DataFrame, meta: dict, path: Path) -> Path:
    """The CSV and its FILE.meta.json, each whole or not at all; the metadata first, so a CSV
    that is there has its metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(json.dumps(meta, indent=2) + "\n", meta_path(path))
    return write_csv(table, path)


# -- the command ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NgramLookupOptions:
    """The command's options, each declared once (perfmodel.cli.fields)."""

    contexts: tuple[int, ...] | None = field(
        default=None,
        metadata=option(
            "--contexts",
            f"history lengths in tokens (default {' '.join(map(str, CONTEXTS))}; "
            f"{' '.join(map(str, QUICK_CONTEXTS))} with --quick)",
            type=token_count,
            nargs="+",
            metavar="TOKENS",
        ),
    )
    ks: tuple[int, ...] | None = field(
        default=None,
        metadata=option(
            "--k",
            f"tokens proposed at most per step (default {' '.join(map(str, KS))}; "
            f"{' '.join(map(str, QUICK_KS))} with --quick)",
            type=positive_int,
            nargs="+",
        ),
    )
    min_n: int = field(
        default=MIN_N, metadata=option("--min-n", "shortest n-gram looked up (default %(default)s)", type=positive_int)
    )
    max_n: int = field(
        default=MAX_N, metadata=option("--max-n", "longest n-gram looked up (default %(default)s)", type=positive_int)
    )
    calls: int | None = field(
        default=None,
        metadata=option(
            "--calls", f"timed steps per point (default {CALLS}; {QUICK_CALLS} with --quick)", type=positive_int
        ),
    )
    sequences: int | None = field(
        default=None,
        metadata=option(
            "--sequences",
            f"histories per step, a batch (default {SEQUENCES}; {QUICK_SEQUENCES} with --quick)",
            type=batch_size,
        ),
    )
    quick: bool = field(
        default=False,
        metadata=option("--quick", "a few points and calls (a second or so), for tests", action="store_true"),
    )
    store: bool = field(
        default=False,
        metadata=option(
            "--store",
            "also keep the result as this host's stored measurement "
            f"(<measurements home>/<host>/{columns.FOLDER}/{columns.FILE_NAME}), where the toolkit reads it",
            action="store_true",
        ),
    )
    out: Path | None = field(
        default=None,
        metadata=shared(options.out, default=DEFAULT_OUT, what="the CSV of seconds per sequence", metavar="FILE.csv"),
    )

    def plan(self) -> LookupPlan:
        return LookupPlan(
            self.contexts or (QUICK_CONTEXTS if self.quick else CONTEXTS),
            self.ks or (QUICK_KS if self.quick else KS),
            self.min_n,
            self.max_n,
            self.calls or (QUICK_CALLS if self.quick else CALLS),
            self.sequences or (QUICK_SEQUENCES if self.quick else SEQUENCES),
        )


def build_parser() -> Parser:
    p = Parser(prog="python -m profilers.ngram_lookup", description=__doc__.split("\n\n")[0])
    add_options(p, NgramLookupOptions)
    return p


def render(table: pd.DataFrame, meta: dict) -> str:
    """The aligned table the command prints: microseconds per sequence per step."""
    text = meta["text"]
    lines = [
        f"n-gram lookup on {meta[columns.META_CPU]} ({meta[columns.META_HOST]}), Python {meta['python']}, numpy "
        f"{meta['numpy']}: measured, {meta['calls']} steps of {meta['sequences']} histories per point, "
        f"{text['stream_tokens']:,} tokens of real text{' (repeated)' if text['repeated'] else ''}",
        f"  {'context':>8} {'k':>3} {'n':>5} {'median us/seq':>14} {'p90 us/seq':>11} {'matched':>8}",
    ]
    for row in table.itertuples(index=False):
        lines.append(
            f"  {row.context:>8} {row.k:>3} {f'{row.min_n}-{row.max_n}':>5} {row.seconds_median * 1e6:>14.2f} "
            f"{row.seconds_p90 * 1e6:>11.2f} {row.matched_share:>8.1%}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = read_options(NgramLookupOptions, build_parser().parse_args(argv))
    plan = args.plan()
    plan.settings()  # one line for a bad --min-n/--max-n before any work
    out = args.out or Path(DEFAULT_OUT.replace("<host>", this_cpu_key()))
    writable_file(out, "--out file")
    stored = user_measurements_dir() / this_cpu_key() / columns.FOLDER / columns.FILE_NAME
    if args.store:
        writable_file(stored, "stored measurement")
    table, meta = measure_ngram_lookup(plan, progress=True)
    meta["quick"] = args.quick
    write_measurement(table, meta, out)
    print(render(table, meta))
    print(f"csv: {out}")
    if args.store:
        write_measurement(table, meta, stored)
        print(f"stored: {stored}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
