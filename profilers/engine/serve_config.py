"""A --speculative-config file loaded in the engine and served: the vLLM export of a
speculation schedule (`python -m perfmodel.schedule --engine vllm`: a band's fixed config, or
the dynamic table) with its `model` pointed at the checkpoint's drafter as the engine loads
it, the server started with it, a short Poisson load played, and from /metrics what it
drafted and accepted. A config the engine refuses ends in one line with the engine's reason.

`python -m profilers.engine serve-config --config FILE` runs it."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from perfmodel.base.engine_speculation import VLLM_METHODS
from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json
from perfmodel.models.hf_config import read_config_json
from perfmodel.serving.engine_drafting import DRAFTER_TWINS
from profilers.engine.export import export_for_engine
from profilers.engine.measure import Plan, export_drafter
from profilers.engine.runs import load_run
from profilers.engine.server import EngineServer

# the drafters the project's checkpoints carry, by vLLM's `method`
METHODS = {VLLM_METHODS[speculation]: speculation for speculation in DRAFTER_TWINS}


def serve_config(
    config_file: Path, plan: Plan, python: Path, rate: float, server_log: Path, log: Callable[[str], None] = print
) -> dict:
    """Serve plan.model with the speculative config in `config_file` and one load run of
    plan.requests at `rate`, the engine's log in `server_log`; the run's requests, its drafts
    and accepted tokens per position."""
    config = read_json(config_file, "speculative config")
    method = config.get("method") if isinstance(config, dict) else None
    if method not in METHODS:
        raise PerfkitError(
            f"{config_file}: method {method!r}; this command serves the drafters the project's checkpoints "
            f"carry: {', '.join(METHODS)}"
        )
    plan = replace(plan, speculation=METHODS[method])
    with tempfile.TemporaryDirectory(prefix="engine-config-") as scratch:
        model_folder = export_for_engine(plan.model, Path(scratch) / "model")
        config["model"] = str(export_drafter(plan, Path(scratch) / "drafter"))
        server = replace(plan.server, speculative_config=json.dumps(config))
        vocab = int(read_config_json(model_folder)["vocab_size"])
        with EngineServer(python, model_folder, server, server_log, name=plan.model) as running:
            log(f"{config_file} loaded: the engine answered after {running.start_s:.0f} s; {plan.requests} requests")
            try:
                run = load_run(running.url, plan.model, vocab, plan.workload(rate, 0), rate, seed=0)
            except OSError:  # the server gone mid-load: its own reason, not the client's refused connection
                running.check_alive()
                raise
            running.check_alive()
    return run


def served_line(config_file: Path, run: dict, rate: float) -> str:
    requests, counted = run["requests"], run["speculation"]
    failed = int((~requests["complete"]).sum())
    accepted = json.loads(counted["accepted_per_position"])
    drafts = counted["drafts"]
    per_step = f"{1 + sum(accepted) / drafts:.2f} tokens a step" if drafts else "no drafts"
    return (
        f"{config_file}: served {len(requests) - failed} of {len(requests)} requests at {rate:g}/s, TPOT p50 "
        f"{requests['tpot_s'].median() * 1e3:.2f} ms; {drafts:,} drafts, accepted per position {accepted} ({per_step})"
    )
