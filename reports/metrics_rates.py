"""A chain's per-position acceptance rates from a vLLM server's /metrics page (Prometheus text),
as `--metrics` reads it: of the drafts the engine proposed, the share whose position j was
accepted (vllm:spec_decode_num_accepted_tokens_per_pos_total{position="j"} over
vllm:spec_decode_num_drafts_total). Given two pages (after a load, and before it), the counters'
growth between them: the load's own acceptance, not the server's whole life's. The page is read
by the engine check's parser (profilers.engine.scrape)."""

from __future__ import annotations

from pathlib import Path

from perfmodel.base.errors import PerfkitError
from profilers.engine.scrape import parse, speculation_counts


def read_page(path: Path) -> dict:
    try:
        return parse(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise PerfkitError(f"--metrics {path}: cannot read it ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise PerfkitError(f"--metrics {path}: not a Prometheus text page ({str(exc).splitlines()[0]})") from None


def metrics_rates(paths) -> tuple[float, ...]:
    """Per-position acceptance rates from one /metrics page, or the growth from the second
    (before) to the first (after)."""
    paths = [Path(p) for p in paths]
    if not 1 <= len(paths) <= 2:
        raise PerfkitError(f"--metrics takes one page, or two (after a load, then before it), not {len(paths)}")
    after = read_page(paths[0])
    before = read_page(paths[1]) if len(paths) == 2 else {}
    counts = speculation_counts(after, before)
    if counts["drafts"] <= 0 or not counts["accepted_per_position"]:
        raise PerfkitError(
            f"--metrics {paths[0]}: no drafts counted (vllm:spec_decode_num_drafts_total and "
            "vllm:spec_decode_num_accepted_tokens_per_pos_total): the page of a vLLM server that speculated"
        )
    return tuple(accepted / counts["drafts"] for accepted in counts["accepted_per_position"])
