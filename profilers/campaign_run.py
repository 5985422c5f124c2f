"""Running a campaign (profilers.campaign_plan) on this machine's device into
`<out>/<device key>/`.

Each stage first asks its output what it lacks: a complete stage is skipped, a stage half
done measures only its missing points (the sweep's journal resumes it), a stage whose
output was removed is measured again. One campaign at a time writes a folder: the
manifest's lock (`campaign.json.lock`) refuses a second one at once, and each sweep holds
its own file's lock as profilers.sweep does. `campaign.json` records the plan, each
stage's status, start, end, wall time and estimate, and the torch, CUDA and driver versions.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from perfmodel.base.errors import PerfkitError
from perfmodel.base.jsonfile import read_json
from perfmodel.base.outputs import writable_dir
from profilers.campaign_estimate import clock, cpu_machine, gpu_machine, stage_seconds
from profilers.campaign_gemm import missing_gemms, run_gemm_grid
from profilers.campaign_plan import (
    CEILINGS_FILE,
    HOST_DISPATCH_FILE,
    MANIFEST,
    CeilingsStage,
    GemmStage,
    HostDispatchStage,
    Plan,
    Stage,
    SweepStage,
    TwinStage,
)
from profilers.ceilings import measure_ceilings
from profilers.closed_loop.twin import TwinConfig, twin_loop
from profilers.closed_loop.twin_print import classes_path, print_twin_batch
from profilers.device import DeviceInfo, check_device, cpu_info, cpu_state, cuda_info, versions
from profilers.host_dispatch import measure_host_dispatch, render
from profilers.store import output_lock
from profilers.sweep_runs import missing_points, run_sweep
from profilers.sweeper import SweepConfig


@dataclass
class Session:
    """What every stage runner needs: the plan, the device and where its files go."""

    plan: Plan
    folder: Path
    info: DeviceInfo
    nvml: object | None  # profilers.device.Nvml on a GPU with NVML
    log: object = print
    progress: bool = True

    def path(self, stage: Stage) -> Path:
        return self.folder / stage.out

    def ceilings(self) -> dict | None:
        """The ceilings the ceilings stage measured, for the sweeps' run metadata (None where
        it left the bandwidth out: those are no roofline)."""
        record = ceilings_record(self.folder / CEILINGS_FILE, self.info.key)
        return record["ceilings"] if record and record["ceilings"]["bandwidth_gb_s"] else None


@dataclass
class StageDone:
    name: str
    rows: int  # in its output now
    measured: int  # by this run
    skipped: int  # by this run (did not fit in memory)
    wall_s: float


@dataclass
class CampaignResult:
    folder: Path
    done: list[StageDone] = field(default_factory=list)  # stages this run measured
    complete: list[str] = field(default_factory=list)  # stages found complete and skipped


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def device_identity(device: str) -> tuple[DeviceInfo, object | None]:
    """The device a campaign measures, or a one-line error (e.g. no CUDA device visible)."""
    check_device(device)
    return cuda_info() if device == "cuda" else (cpu_info(), None)


def sweep_config(stage: SweepStage, session: Session) -> SweepConfig:
    plan = session.plan
    return SweepConfig(
        plan.device,
        stage.model,
        plan.dtype,
        stage.grid,
        session.path(stage),
        stage.ops,
        stage.phases,
        plan.timer,
        ceilings=False,  # measured once by the ceilings stage, recorded with every sweep
        progress=session.progress,
    )


def ceilings_record(path: Path, device_key: str) -> dict | None:
    """A ceilings stage's record of this device, or None (absent, another device's, or
    torn by a kill: written again)."""
    if not path.exists():
        return None
    try:
        record = read_json(path, "ceilings record")
    except PerfkitError:
        return None
    ok = isinstance(record, dict) and record.get("device", {}).get("key") == device_key and record.get("ceilings")
    return record if ok else None


def remaining(stage: Stage, session: Session) -> int:
    """How many of the stage's points its output lacks (0: complete)."""
    if isinstance(stage, CeilingsStage):
        return 0 if ceilings_record(session.path(stage), session.info.key) else stage.size()
    if isinstance(stage, SweepStage):
        return len(missing_points(sweep_config(stage, session), session.info.key))
    if isinstance(stage, TwinStage):
        done = twin_batches_done(session.path(stage))
        return sum(len(stage.sizes) + 1 for b in stage.batches if b not in done)
    if isinstance(stage, HostDispatchStage):
        return 0 if session.path(stage).exists() else stage.size()
    return len(missing_gemms(stage, session.path(stage), session.info.key, session.plan.dtype))


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")
    tmp.replace(path)  # atomic: a kill never leaves half a file


def run_ceilings(stage: CeilingsStage, session: Session) -> StageDone:
    info, nvml = session.info, session.nvml
    started = time.perf_counter()
    ceilings = measure_ceilings(info, stage.dtypes, session.log, stage.timer, stage.streams)
    state = nvml.state() if nvml is not None else (cpu_state() if info.kind == "cpu" else {})
    record = {"device": info.as_dict(), "state": state, "ceilings": ceilings.as_dict(), "timer": asdict(stage.timer)}
    write_json(session.path(stage), record)
    return StageDone(stage.name, stage.size(), stage.size(), 0, time.perf_counter() - started)


def run_sweep_stage(stage: SweepStage, session: Session) -> StageDone:
    started = time.perf_counter()
    result = run_sweep(sweep_config(stage, session), session.log, ceilings=session.ceilings())
    return StageDone(stage.name, result.total_rows, result.measured, result.skipped, time.perf_counter() - started)


def run_gemm_stage(stage: GemmStage, session: Session) -> StageDone:
    started = time.perf_counter()
    result = run_gemm_grid(
        stage,
        session.path(stage),
        session.info,
        session.nvml,
        session.plan,
        session.ceilings(),
        session.log,
        session.progress,
    )
    return StageDone(stage.name, result.total_rows, result.measured, result.skipped, time.perf_counter() - started)


def twin_batches_done(path: Path) -> set[int]:
    """Batch sizes a twin stage's file holds (each written whole, after its batch ran)."""
    if not path.exists():
        return set()
    return set(int(b) for b in pd.read_csv(path, usecols=["batch"])["batch"])


def run_twin_stage(stage: TwinStage, session: Session) -> StageDone:
    """Each batch size the file lacks: the twin's closed loop, its rows appended (the
    per-class table first, so the per-tree rows mark a batch done), its calibration and
    the device's identity in `.meta.json`."""
    started = time.perf_counter()
    path, plan = session.path(stage), session.plan
    path.parent.mkdir(parents=True, exist_ok=True)
    meta_path = path.with_suffix(".meta.json")
    meta = read_json(meta_path, "twin metadata") if meta_path.exists() else {"batches": {}}
    meta.update(device=session.info.as_dict(), versions=campaign_versions(session.info), stage=asdict(stage))
    done, measured = twin_batches_done(path), 0
    for batch in stage.batches:
        if batch in done:
            continue
        host = session.folder / HOST_DISPATCH_FILE
        config = TwinConfig(
            model=stage.model,
            replay=Path(stage.record),
            batch=batch,
            sizes=stage.sizes,
            dtype=plan.dtype,
            device=plan.device,
            prompts=max(stage.prompts, batch),
            prompt_len=stage.prompt_len,
            new_tokens=stage.new_tokens,
            rounds=stage.rounds,
            launch=stage.launch,
            profile=stage.profile,
            # a GPU's steps priced as host and device queues where the host's costs were measured
            host_dispatch=host if plan.device == "cuda" and host.exists() else None,
        )
        table, classes, summary = twin_loop(config, session.log)
        session.log(f"batch {batch}, {stage.launch} steps:")
        print_twin_batch(table, classes, summary)
        for frame, where in ((classes, classes_path(path)), (table, path)):
            if not frame.empty:  # classes not profiled: no file
                frame.to_csv(where, mode="a", header=not where.exists(), index=False)
        meta["batches"][str(batch)] = {**summary, "finished": now()}
        write_json(meta_path, meta)
        measured += len(table)
    rows = len(pd.read_csv(path)) if path.exists() else 0
    return StageDone(stage.name, rows, measured, 0, time.perf_counter() - started)


def run_host_dispatch_stage(stage: HostDispatchStage, session: Session) -> StageDone:
    started = time.perf_counter()
    result = measure_host_dispatch(session.plan.device, quick=stage.quick)
    session.log(render(result))
    result.to_json(session.path(stage))
    return StageDone(stage.name, stage.size(), stage.size(), 0, time.perf_counter() - started)


RUNNERS = {
    HostDispatchStage: run_host_dispatch_stage,
    CeilingsStage: run_ceilings,
    SweepStage: run_sweep_stage,
    GemmStage: run_gemm_stage,
    TwinStage: run_twin_stage,
}


def campaign_versions(info: DeviceInfo) -> dict:
    return {**versions(), "driver": info.details.get("driver")}


def open_manifest(path: Path, plan: Plan, info: DeviceInfo) -> dict:
    """The folder's manifest, or a new one; a folder holding another variant or dtype of
    the campaign is refused (its files would mix two grids)."""
    if path.exists():
        manifest = read_json(path, "campaign manifest")
        had = (manifest.get("variant"), manifest.get("dtype"))
        if had != (plan.variant, plan.dtype):
            raise PerfkitError(
                f"{path} is a {had[0]} {had[1]} campaign; this one is {plan.variant} {plan.dtype}: give another --out"
            )
    else:
        manifest = {"variant": plan.variant, "dtype": plan.dtype, "started": now(), "finished": None, "runs": []}
    manifest.update(device=info.as_dict(), versions=campaign_versions(info), timer=asdict(plan.timer))
    known = {entry["name"]: entry for entry in manifest.get("stages", [])}
    manifest["stages"] = [
        {**known.get(stage.name, {"status": "pending"}), "name": stage.name, "output": stage.out}
        | {"points": stage.size(), "what": stage.what}
        for stage in plan.stages
    ]
    return manifest


def run_campaign(plan: Plan, out_root: str | Path, log=print, progress: bool = True) -> CampaignResult:
    """Measure what `<out_root>/<device key>/` lacks of the plan, stage by stage. Each
    stage's estimate (profilers.campaign_estimate) is kept in the manifest beside its
    measured wall time, to check the estimates by."""
    info, nvml = device_identity(plan.device)
    machine = gpu_machine(info) if plan.device == "cuda" else cpu_machine(info)
    folder = writable_dir(Path(out_root) / info.key, "campaign folder")
    session = Session(plan, folder, info, nvml, log, progress)
    path = folder / MANIFEST
    with output_lock(path):
        manifest = open_manifest(path, plan, info)
        entries = {entry["name"]: entry for entry in manifest["stages"]}
        lacking = {stage.name: remaining(stage, session) for stage in plan.stages}
        result = CampaignResult(folder)
        if not any(lacking.values()):
            for entry in manifest["stages"]:
                entry["status"] = "done"
            manifest["finished"] = manifest["finished"] or now()
            write_json(path, manifest)
            result.complete = plan.names()
            log(
                f"nothing to do: all {len(plan.stages)} stages of the {plan.variant} campaign are complete in {folder} "
                "(remove a stage's output to measure it again)"
            )
            return result
        run = {"started": now(), "finished": None, "stages": [], "interrupted_in": None}
        manifest["runs"].append(run)
        manifest["finished"] = None
        try:
            for i, stage in enumerate(plan.stages, 1):
                entry = entries[stage.name]
                if not lacking[stage.name]:
                    entry["status"] = "done"
                    result.complete.append(stage.name)
                    log(f"[{i}/{len(plan.stages)}] {stage.name}: complete in {stage.out}, skipped")
                    continue
                estimate = stage_seconds(stage, plan, machine) if machine is not None else None
                said = f" (estimated {clock(estimate)} for the whole stage)" if estimate is not None else ""
                log(
                    f"[{i}/{len(plan.stages)}] {stage.name}: {lacking[stage.name]:,} of {stage.size():,} to measure "
                    f"-> {stage.out}{said}"
                )
                run["interrupted_in"] = stage.name
                entry.update(status="running", started=now(), finished=None, estimated_s=estimate)
                write_json(path, manifest)
                done = RUNNERS[type(stage)](stage, session)
                entry.update(
                    status="done",
                    finished=now(),
                    wall_s=round(done.wall_s, 3),
                    rows=done.rows,
                    measured=done.measured,
                    skipped=done.skipped,
                )
                run["stages"].append(stage.name)
                run["interrupted_in"] = None
                result.done.append(done)
                write_json(path, manifest)
                log(
                    f"[{i}/{len(plan.stages)}] {stage.name}: {done.measured:,} measured, {done.skipped:,} skipped, "
                    f"{done.rows:,} rows in {stage.out} ({clock(done.wall_s)})"
                )
        finally:
            run["finished"] = now()
            if run["interrupted_in"] is None:
                manifest["finished"] = run["finished"]
            write_json(path, manifest)
        return result
