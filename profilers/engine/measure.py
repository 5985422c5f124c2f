"""One measurement of the engine, into a folder (perfmodel.measured.engine_runs says what each
file holds): the checkpoint exported, the server started, the step sweep (the simulation's
costs), then the load runs (what it predicts), the server stopped. Interrupted, it resumes:
the step sweep and each finished run are kept, and a rerun measures only what is missing."""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from decoder.draft_train import draft_for
from perfmodel.base.engine_speculation import DRAFT_TOKENS, VLLM_METHODS, EngineSpeculation
from perfmodel.base.errors import PerfkitError
from perfmodel.base.output_locks import claimed_dir
from perfmodel.measured.engine_runs import (
    DECODER_REQUESTS_FILE,
    REQUEST_COLUMNS,
    RUN_COLUMNS,
    SPECULATION_COLUMNS,
    STEP_COLUMNS,
    STEP_SPECULATION_COLUMNS,
)
from perfmodel.models.hf_config import read_config_json
from perfmodel.planning.lengths import Lengths
from perfmodel.planning.workload import Workload
from perfmodel.serving.engine_drafting import DRAFTER_TWINS
from perfmodel.serving.simulator import steady_throughput
from profilers.device import cpu_info
from profilers.engine.acceptance import write_decoder_speculation
from profilers.engine.export import export_eagle_drafter, export_for_engine, export_medusa_heads
from profilers.engine.install import ENGINE, engine_version
from profilers.engine.runs import load_run
from profilers.engine.server import ENGINE_NICENESS, EngineServer, ServerConfig
from profilers.engine.steps import StepSweep, sweep_steps

KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}


@dataclass(frozen=True)
class Plan:
    """What to measure: the model, how the engine serves it, the step sweep, and the load."""

    model: str = "bundled"
    server: ServerConfig = ServerConfig()
    sweep: StepSweep = StepSweep()
    prompt_len: int = 128
    response_len: int = 64
    requests: int = 300
    rates: tuple[float, ...] = (10.0, 20.0, 25.0, 30.0)
    repeats: int = 2
    seed: int = 0
    speculation: EngineSpeculation = EngineSpeculation.OFF

    def __post_init__(self) -> None:
        object.__setattr__(self, "speculation", EngineSpeculation(self.speculation))  # the member, given its name

    def workload(self, rate: float, repeat: int) -> Workload:
        lengths = Lengths(self.prompt_len, self.prompt_len), Lengths(self.response_len, self.response_len)
        return Workload(*lengths, rate, None, self.requests, self.seed + repeat)

    def runs(self) -> list[tuple[float, int]]:
        """(rate, repeat) of every load run, repeats in turn over the rates."""
        return [(rate, repeat) for repeat in range(self.repeats) for rate in self.rates]

    def identity(self) -> dict:
        """What a resumed measurement must share with the folder's."""
        return {k: v for k, v in asdict(self).items() if k not in ("rates", "repeats")}


@dataclass(frozen=True)
class Exported:
    """The plan's checkpoint as the engine loads it: the model's folder and its drafter's (None: none)."""

    model: Path
    drafter: Path | None = None


def kv_cache_tokens(log: Path) -> int:
    found = KV_TOKENS.findall(log.read_text(errors="replace"))
    if not found:
        raise PerfkitError(f"the engine did not log its KV cache size (log: {log})")
    return int(found[-1].replace(",", ""))


def append_csv(frame: pd.DataFrame, path: Path, columns: tuple[str, ...]) -> None:
    frame = frame[list(columns)]
    frame.to_csv(path, mode="a", header=not path.exists(), index=False)


def measured_tokens_s(requests: pd.DataFrame, token_times: np.ndarray) -> float:
    """Steady-state output tokens per second, as the simulation defines it."""
    times = np.concatenate([[0.0], np.sort(token_times)])
    return steady_throughput(requests["finish_s"].to_numpy(dtype=float), times, np.arange(len(times), dtype=float))


def measure(plan: Plan, out: Path, python: Path, log: Callable[[str], None] = print, port: int | None = None) -> Path:
    """Measure `plan` into `out` (see the module doc); returns `out`. The folder is held to the
    end (perfmodel.base.output_locks.claimed_dir): a second measurement into it is refused, not
    appended to its tables between the first one's rows."""
    with claimed_dir(out, "measurement folder"):
        meta_file = out / "meta.json"
        version = engine_version(python)
        if meta_file.exists():
            meta = json.loads(meta_file.read_text())
            same_plan = meta["plan"] == json.loads(json.dumps(plan.identity(), default=str))
            if meta["engine"]["version"] != version or not same_plan:
                raise PerfkitError(f"{out} holds a measurement of another engine or plan; choose another --out")
        runs_file = out / "runs.csv"
        done = set()
        if runs_file.exists():
            done = {(float(r), int(p)) for r, p in pd.read_csv(runs_file)[["rate", "repeat"]].itertuples(index=False)}
        wanted = plan.runs()
        steps_file = out / "steps.csv"
        if steps_file.exists() and set(pd.read_csv(steps_file)["pass"]) == {0, 1} and all(w in done for w in wanted):
            log(f"{out}: every run is measured already; nothing to do")
            return with_decoder_acceptance(plan, out, log)
        # The exported weights are a copy of the checkpoint's: made for the run, not kept.
        with tempfile.TemporaryDirectory(prefix="engine-model-") as scratch:
            model_folder = export_for_engine(plan.model, Path(scratch) / "model")
            exported = Exported(model_folder, export_drafter(plan, Path(scratch) / "drafter"))
            serve_and_measure(plan, out, python, exported, version, done, log, port)
        return with_decoder_acceptance(plan, out, log)


def with_decoder_acceptance(plan: Plan, out: Path, log: Callable[[str], None]) -> Path:
    """Where the engine drafted with the model's Medusa heads or EAGLE drafter, the project's
    decoder drafting the same way on the same prompts (profilers.engine.acceptance), once;
    returns `out`."""
    if plan.speculation in DRAFTER_TWINS and not (out / DECODER_REQUESTS_FILE).exists():
        log("the project's decoder drafting as the engine did, on the same prompts")
        write_decoder_speculation(out, log)
    return out


def export_drafter(plan: Plan, out: Path) -> Path | None:
    """The plan's drafting model as the engine loads it (None: none to load)."""
    if plan.speculation is EngineSpeculation.MEDUSA:
        return export_medusa_heads(plan.model, out)
    if plan.speculation is EngineSpeculation.EAGLE:
        return export_eagle_drafter(plan.model, out)
    if plan.speculation is EngineSpeculation.DRAFT:
        return export_for_engine(draft_for(plan.model), out)
    return None


def speculative_config(plan: Plan, drafter: Path | None) -> dict | None:
    """The engine's --speculative-config for the plan's speculation (None: plain decoding)."""
    if plan.speculation is EngineSpeculation.OFF:
        return None
    method = VLLM_METHODS[plan.speculation]
    if plan.speculation is EngineSpeculation.MEDUSA:
        count = int(read_config_json(drafter)["num_heads"])
        return {"method": method, "model": str(drafter), "num_speculative_tokens": count}
    if plan.speculation is EngineSpeculation.NGRAM:
        return {"method": method, "num_speculative_tokens": DRAFT_TOKENS, **NGRAM_LOOKUP}
    return {"method": method, "model": str(drafter), "num_speculative_tokens": DRAFT_TOKENS}


def serve_and_measure(
    plan: Plan,
    out: Path,
    python: Path,
    exported: Exported,
    version: str,
    done: set[tuple[float, int]],
    log: Callable[[str], None],
    port: int | None,
) -> None:
    """measure()'s work once the model is exported: the server up, the sweep's two passes
    around the load runs still missing, each written as it finishes."""
    model_folder, drafter = exported.model, exported.drafter
    meta_file, runs_file = out / "meta.json", out / "runs.csv"
    wanted = plan.runs()
    vocab = int(read_config_json(model_folder)["vocab_size"])
    server_log = out / "server.log"
    spec = speculative_config(plan, drafter)
    server_config = replace(plan.server, speculative_config=json.dumps(spec) if spec else "")
    said = replace(plan.server, speculative_config=json.dumps(spec).replace(str(drafter), "<drafter>") if spec else "")
    with EngineServer(python, model_folder, server_config, server_log, name=plan.model, port=port) as server:
        log(f"{ENGINE} {version} serving {plan.model} on {server.url} after {server.start_s:.0f} s")
        if not meta_file.exists():
            meta = {
                "engine": {
                    "name": ENGINE,
                    "version": version,
                    "kv_cache_tokens": kv_cache_tokens(server_log),
                    "niceness": ENGINE_NICENESS,
                    "arguments": said.arguments(Path("<model>"), plan.model, 0),
                    "start_s": round(server.start_s, 1),
                },
                "server": plan.server.as_dict(),
                "plan": plan.identity(),
                "model": read_config_json(model_folder),
                "machine": cpu_info().as_dict(),
                "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            meta_file.write_text(json.dumps(meta, indent=1, default=str))
        sweep_pass(0, plan, out, server.url, vocab, log)
        for rate, repeat in wanted:
            if (rate, repeat) in done:
                continue
            server.check_alive()
            run = load_run(server.url, plan.model, vocab, plan.workload(rate, repeat), rate, seed=repeat)
            requests = run["requests"].assign(rate=rate, repeat=repeat)
            tokens_s = measured_tokens_s(requests, run["token_times"])
            append_csv(requests, out / "requests.csv", REQUEST_COLUMNS)
            summary = {
                "rate": rate,
                "repeat": repeat,
                "requests": len(requests),
                "failed": int((~requests["complete"]).sum()),
                "wall_s": round(run["wall_s"], 3),
                "preemptions": run["preemptions"],
                "tokens_s": tokens_s,
                "client_lag_max_s": float((requests["sent_s"] - requests["arrival_s"]).max()),
                "iteration_tokens": json.dumps(run["iteration_tokens"]),
            }
            append_csv(pd.DataFrame([summary]), runs_file, RUN_COLUMNS)
            if spec:
                drafted = {"rate": rate, "repeat": repeat, **run["speculation"]}
                append_csv(pd.DataFrame([drafted]), out / "speculation.csv", SPECULATION_COLUMNS)
            ttft, tpot = requests["ttft_s"].median() * 1e3, requests["tpot_s"].median() * 1e3
            log(
                f"rate {rate:g}/s, repeat {repeat}: {len(requests)} requests in {run['wall_s']:.1f} s, "
                f"TTFT p50 {ttft:.1f} ms, TPOT p50 {tpot:.2f} ms, {tokens_s:,.0f} tokens/s"
            )
        sweep_pass(1, plan, out, server.url, vocab, log)


def sweep_pass(number: int, plan: Plan, out: Path, url: str, vocab: int, log) -> None:
    """The step sweep, once before the load runs and once after (pass 0 and 1): the machine's
    speed drifts by 10-20% over minutes here, and the costs are the two passes' mean."""
    steps_file = out / "steps.csv"
    if steps_file.exists() and number in set(pd.read_csv(steps_file)["pass"]):
        return
    log(f"step sweep, pass {number} ({'before' if number == 0 else 'after'} the load runs)")
    steps = sweep_steps(url, plan.model, vocab, plan.sweep, plan.server.max_num_seqs, log).assign(**{"pass": number})
    append_csv(steps, steps_file, (*STEP_COLUMNS, *STEP_SPECULATION_COLUMNS))
