"""The fault battery: bad inputs to every command, each answered with one clear line (or a
sensible answer), and nothing left half-written.

    python -m tests.battery            # every case, a line each, then the count; exit 1 on a failure
    python -m tests.battery --only plan --verbose

Issue #56 found 20 inputs among 246 that the toolkit answered silently wrong, half-wrote, or
let run unbounded; these cases keep them answered. Each case runs a command in this process
(as `python -m` runs it, through perfmodel.cli.run) in a folder of its own, and is held to:

- an error: exit status 1 (or 2, argparse's usage error), stderr exactly one line that starts
  `error:` (or `<prog>: error:`) and holds the fragment the case names, and the case's folder
  as it was: no output, complete or partial;
- an answer: exit status 0, stdout holding the fragment, and no temporary or partial file left.

tests/test_battery.py runs the same cases under pytest (CI); this module prints them.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import shlex
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hw_specs import SPEC_DIR
from perfmodel.cli import run
from perfmodel.cli.console import COMMANDS, command_code

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "model_configs"
BUNDLED = ROOT / "decoder" / "assets" / "bundled"
# What a command may leave behind while it writes (perfmodel.base.outputs writes beside the
# target, then renames): none of these may survive a command.
PARTIAL_SUFFIXES = (".tmp", ".part", ".partial")


@dataclass(frozen=True)
class Case:
    """One input to one command and what it must get back. `line` is the command's arguments
    as a shell would split them; it may name the materials ({moe}, {spec_1e12}, ...:
    materials()), {out} (a folder inside the case's own) and {out_file} (a file in it)."""

    command: str  # a medusa-perfkit command (perfmodel.cli.console.COMMANDS)
    line: str
    says: str  # a fragment of the one error line, or of the answer's stdout
    answer: bool = False  # True: a sensible answer (exit 0), not an error
    item: str = ""  # the issue #56 item it comes from, where one

    @property
    def name(self) -> str:
        return f"{self.command} {self.line}"


def error(command: str, line: str, says: str, item: str = "") -> Case:
    return Case(command, line, says, item=item)


def answer(command: str, line: str, says: str, item: str = "") -> Case:
    return Case(command, line, says, answer=True, item=item)


CASES: tuple[Case, ...] = (
    # ---- issue #56 item 1: mixture-of-experts configs are not priced as dense models; since issue
    # 60 their experts are priced (every one in memory, each layer from the measured MoE tables)
    error("plan", "--model {mixtral} --gpu h100 --latency-ms 50 --tp 1", says="it needs 2 devices", item="1"),
    answer("plan", "--model {qwen3_30b_a3b} --gpu h100", says="measured bf16 MoE layers", item="1"),
    error("speedup", "--model {qwen3_235b} --gpu h100", says="it needs 8 devices", item="1"),
    answer("speedup", "--model {gpt_oss_20b} --gpu h100 --out {out}", says="measured mxfp4 MoE layers", item="1"),
    answer("roofline", "--gpu h200 --model {deepseek_v3} --out {out}", says="latent attention: measured", item="1"),
    error("roofline", "--gpu h200 --model {deepseek_v32} --out {out}", says="index_topk", item="1"),
    answer("schedule", "--model {mixtral} --gpu h100 --tp 2 --out {out}", says="wrote", item="1"),
    error("reports", "build --gpu h100 --model {mixtral} --out {out}", says="it needs 2 devices"),
    answer("plan", "--model {llama4} --gpu h100 --tp auto", says="measured bf16 MoE layers", item="1"),
    error("trace", "--model {mixtral}", says="mixture-of-experts", item="1"),
    error("checkpoint", "{moe_checkpoint}", says="mixture-of-experts", item="1"),
    error("plan", "--model {sliding} --gpu h100", says="sliding_window = 4096", item="1"),
    answer("plan", "--model {qwen3_32b} --gpu h200 --latency-ms 50", says="NVIDIA H200", item="1"),
    # ---- item 2: FP8 checkpoints are priced in their own precision (issue 60), not as bf16;
    # a device without fp8 tensor cores says so; an unmeasured dtype says so
    answer("plan", "--model {qwen3_32b_fp8} --gpu h100 --latency-ms 50", says="fp8-block weights", item="2"),
    error("speedup", "--model {llama70b_fp8} --gpu a100", says="cannot run them", item="2"),
    answer(
        "speedup",
        "--gpu h100 --model llama-7b --tree-size 8 --acceleration 2 --dtype fp8",
        says="no fp8 measurements of h100-sxm",
        item="2",
    ),
    error("speedup", "--gpu a40 --dtype fp8 --out {out}", says="has no fp8 peak"),
    # ---- item 3: one rule for tensor-parallel degrees
    error("plan", "--model llama-2-70b --gpu a100 --tp 16", says="largest degree it can serve", item="3"),
    error("plan", "--model llama-2-70b --gpu a100 --tp 32", says="is 2 (usable: 1, 2)", item="3"),
    error("plan", "--model llama-2-70b --gpu rtx-4090 --tp 16", says="serve for llama-2-70b is 4", item="3"),
    error("speedup", "--model llama-2-70b --gpu rtx-4090 --tp 32", says="is 4 (usable", item="3"),
    error("speedup", "--model llama-2-70b --gpu h100 --tp 16", says="is 8 (usable", item="3"),
    error("plan", "--model llama-7b --gpu h100 --tp 3", says="tensor parallel 3 cannot be served on h100-sxm"),
    error("plan", "--model llama-7b --gpu h100 --tp 0", says="--tp"),
    answer("plan", "--model llama-2-70b --gpu a100 --tp 2 --latency-ms 80", says="x2 (tensor parallel)", item="3"),
    # ---- item 4: accelerations a tree cannot reach
    error(
        "speedup", "--gpu a100 --model llama-7b --tree-size 4 --acceleration 50", says="yields 1 to 4 tokens", item="4"
    ),
    error(
        "speedup", "--gpu a100 --model llama-7b --tree-size 2 --acceleration 3", says="yields 1 to 2 tokens", item="4"
    ),
    error(
        "speedup", "--gpu a100 --model llama-7b --tree-size 4 --acceleration inf", says="--acceleration inf", item="4"
    ),
    error(
        "speedup", "--gpu a100 --model llama-7b --tree-size 4 --acceleration nan", says="--acceleration nan", item="4"
    ),
    error(
        "speedup", "--gpu a100 --model llama-7b --tree-size 4 --acceleration 0.5", says="yields 1 to 4 tokens", item="4"
    ),
    error("speedup", "--gpu a100 --model llama-7b --tree-size 1 --acceleration 1", says="at least one candidate"),
    error("speedup", "--gpu a100 --model llama-7b --acceleration 2", says="--tree-size"),
    answer(
        "speedup", "--gpu a100 --model llama-7b --tree-size 64 --acceleration 5", says="at acceleration 5", item="4"
    ),
    # ---- item 5: a model without heads has no tree, whichever command asks
    error("speedup", "--gpu h100 --model {no_heads}", says="has no Medusa heads", item="5"),
    error(
        "speedup", "--gpu h100 --model {no_heads} --tree-size 8 --acceleration 2", says="has no Medusa heads", item="5"
    ),
    answer(
        "plan", "--model {no_heads} --gpu h100 --latency-ms 30", says="none (the model has no Medusa heads)", item="5"
    ),
    error("reports", "build --gpu h100 --model {no_heads} --out {out}", says="no tree to report", item="5"),
    # ---- item 6: spec numbers outside physical ranges are refused at load
    error("plan", "--model llama-7b --spec {spec_1e12} --latency-ms 30", says="'memory_gb' is 1e+12", item="6"),
    error(
        "roofline",
        "--spec {spec_bandwidth_bytes} --model llama-7b --batch 1 --seq 128 --candidates 1 16 --jobs 1 --out {out}",
        says="'memory_bandwidth_gb_s'",
        item="6",
    ),
    error("speedup", "--spec {spec_peak_flops} --model llama-7b", says="'peak_tflops.fp16' is 1e+15", item="6"),
    error("speedup", "--spec {spec_negative} --model llama-7b", says="must be positive"),
    error(
        "roofline",
        "--spec {spec_not_yaml} --model llama-7b --batch 1 --seq 128 --candidates 1 16 --jobs 1 --out {out}",
        says="not valid YAML",
    ),
    error(
        "roofline",
        "--spec {missing} --model llama-7b --batch 1 --seq 128 --candidates 1 16 --jobs 1 --out {out}",
        says="cannot read spec file",
    ),
    # ---- items 13-15: unbounded inputs
    error("reports", "build --gpu a100 --model llama-7b --jobs 10000 --out {out}", says="--jobs", item="13"),
    error(
        "roofline",
        "--gpu a100 --model llama-7b --batch 1 --seq 128 --candidates 1 16 --jobs 10000 --out {out}",
        says="--jobs",
    ),
    error("sweep", "--budget nan --out {out_file}", says="--budget", item="14"),
    error("sweep", "--budget inf --out {out_file}", says="--budget", item="14"),
    error("sweep", "--budget -1 --out {out_file}", says="--budget", item="14"),
    error("sweep", "--budget 0 --out {out_file}", says="--budget", item="14"),
    error("plan", "--model llama-7b --gpu h100 --latency-ms 30 --throughput 1e30", says="at most 1e+12", item="15"),
    error("plan", "--model llama-7b --gpu h100 --latency-ms 30 --throughput 1e300", says="at most 1e+12", item="15"),
    error("plan", "--model llama-7b --gpu h100 --rate 1e30 --tpot-ms 50", says="at most 1e+09", item="15"),
    error("plan", "--model llama-7b --gpu h100 --latency-ms 30 --throughput nan", says="nan"),
    error("plan", "--model llama-7b --gpu h100 --latency-ms 30 --throughput -5", says="-5"),
    error("plan", "--model llama-7b --gpu h100 --latency-ms nan", says="nan"),
    error("plan", "--model llama-7b --gpu h100 --latency-ms 0", says="0"),
    error("plan", "--model llama-7b --gpu h100 --rate nan --tpot-ms 50", says="nan"),
    error("plan", "--model llama-7b --gpu h100 --rate -1 --tpot-ms 50", says="-1"),
    error("plan", "--model llama-7b --gpu h100 --rate 5 --tpot-ms inf", says="inf"),
    error("plan", "--model llama-7b --gpu h100 --rate 5 --ttft-ms -3", says="-3"),
    error("plan", "--model llama-7b --gpu h100 --rate 5 --tpot-ms 50 --percentile 42", says="42"),
    error("plan", "--model llama-7b --gpu h100 --rate 5 --tpot-ms 50 --max-seqs 0", says="--max-seqs"),
    error("plan", "--model llama-7b --gpu h100 --prompt-len 0", says="--prompt-len"),
    error("plan", "--model llama-7b --gpu h100 --response-len -5", says="--response-len"),
    error("plan", "--model llama-7b --gpu h100 --reserve 1.5", says="1.5"),
    error("plan", "--model llama-7b --gpu h100 --trace {missing} --tpot-ms 50", says="missing"),
    # ---- item 12: inputs checked before work
    error("schedule", "--model llama-7b --gpu h100 --closed-loop {missing} --out {out}", says="missing", item="12"),
    error("speedup", "--gpu a100 --model llama-7b --acceptance-rates {missing} --out {out}", says="missing"),
    error("speedup", "--gpu a100 --model llama-7b --acceptance-rates {corrupt_json} --out {out}", says="corrupt.json"),
    error(
        "roofline",
        "--gpu a100 --model llama-7b --batch 1 --seq 128 --candidates 16 --measurements {missing} --out {out}",
        says="missing",
    ),
    # ---- names and choices
    error("plan", "--model llama-8x --gpu h100", says="unknown model 'llama-8x'"),
    error("plan", "--model llama-7b --gpu h1000", says="unknown device 'h1000'"),
    error("speedup", "--gpu a100 --dtype fp4", says="fp4"),
    error(
        "roofline",
        "--gpu a100 --dtype int4 --model llama-7b --batch 1 --seq 128 --candidates 1 16 --jobs 1 --out {out}",
        says="int4",
    ),
    error("plan", "--model llama-7b --gpu h100 --medusa maybe", says="maybe"),
    error("speedup", "--gpu a100 --model llama-7b --drafter lookahead", says="lookahead"),
    error("speedup", "--gpu a100 --model llama-7b --draft-alpha 1.5", says="1.5"),
    error("speedup", "--gpu a100 --model llama-7b --draft-cost nan", says="nan"),
    error("schedule", "--model llama-7b --gpu h100 --engine tgi --out {out}", says="tgi"),
    error("plan", "--model {empty_json} --gpu h100", says="missing key"),
    error("plan", "--model {not_an_object} --gpu h100", says="expected a JSON object"),
    # ---- sizes
    error("speedup", "--gpu a100 --model llama-7b --tree-size 8 --acceleration 2 --batch 0", says="--batch"),
    error("speedup", "--gpu a100 --model llama-7b --tree-size 8 --acceleration 2 --context -1", says="--context"),
    error(
        "speedup", "--gpu a100 --model llama-7b --tree-size 8 --acceleration 2 --context 4096", says="context of 2048"
    ),
    error("roofline", "--gpu a100 --model llama-7b --batch 0 --out {out}", says="--batch"),
    error("roofline", "--gpu a100 --model llama-7b --seq nan --out {out}", says="--seq"),
    error("plan", "--model llama-7b --gpu h100 --batch 2000000", says="--batch"),
    error("schedule", "--model llama-7b --gpu h100 --max-batch 0 --out {out}", says="--max-batch"),
    error("schedule", "--model llama-7b --gpu h100 --sizes 0 --out {out}", says="--sizes"),
    error("trace", "--model llama-7b --tree-size 0", says="--tree-size"),
    error("trace", "--model llama-7b --batch -2", says="--batch"),
    # ---- the decoder and what measures it: bad input refused before a model is loaded
    error("generate", "--prompt hello --max-new-tokens 0", says="--max-new-tokens"),
    error("generate", "--prompt hello --temperature nan", says="nan"),
    error("generate", "--prompt hello --temperature -1", says="-1"),
    error("generate", "--prompt hello --model {moe_checkpoint}", says="mixture-of-experts"),
    error("generate", "--prompt hello --model {missing}", says="missing"),
    error("generate", "--prompt hello --tree {corrupt_json}", says="a tree is a list of paths"),
    error("measure", "--model {moe_checkpoint} --out {out}", says="mixture-of-experts"),
    error("measure", "--prompts 0 --out {out}", says="--prompts"),
    error("measure", "--new-tokens -4 --out {out}", says="--new-tokens"),
    error("measure", "--sizes 0 --out {out}", says="--sizes"),
    error("ablation", "--batch 0", says="--batch"),
    error("ablation", "--max-nodes -1", says="--max-nodes"),
    error("train", "--steps 0 --out {out}", says="--steps"),
    error("train", "--seed nan --out {out}", says="nan"),
    error("checkpoint", "{missing}", says="missing"),
    error("checkpoint", "{sliding}", says="sliding_window = 4096"),
    error("validate", "--budget nan", says="--budget"),
    error("validate", "--sizes 0", says="--sizes"),
    error("validate", "--engine tgi", says="tgi"),
    error("step-bench", "--batch 0", says="--batch"),
    error("step-bench", "--rounds 0", says="--rounds"),
    # ---- measuring this machine: bad input refused before anything is timed
    error("sweep", "--target-noise nan --out {out_file}", says="nan"),
    error("sweep", "--target-noise -0.1 --out {out_file}", says="-0.1"),
    error("sweep", "--flush-mb -1 --out {out_file}", says="-1"),
    error("sweep", "--max-memory-gb inf --out {out_file}", says="inf"),
    error("sweep", "--threads 0 --out {out_file}", says="--threads"),
    error("sweep", "--model {mixtral} --out {out_file}", says="mixture-of-experts"),
    error("sweep", "--ops softmax9 --out {out_file}", says="softmax9"),
    error("allreduce", "--ranks 0 --out {out}", says="--ranks"),
    error("allreduce", "--budget nan --out {out}", says="--budget"),
    error("campaign", "--stage everything --out {out}", says="everything"),
    error("import", "vidur {missing} --gpu a100-sxm --out {out_file}", says="missing"),
    # ---- the serving engine: options checked before the engine starts
    error("engine", "check --rates nan --out {out}", says="nan"),
    error("engine", "check --rates 0 --out {out}", says="0"),
    error("engine", "check --max-num-seqs 0 --out {out}", says="--max-num-seqs"),
    error("engine", "check --requests -1 --out {out}", says="--requests"),
    error("engine", "check --prompt-len 0 --out {out}", says="--prompt-len"),
    error("engine", "check --model {moe_checkpoint} --out {out}", says="mixture-of-experts"),
    error("engine", "check --speculation lookahead --out {out}", says="lookahead"),
    # ---- reports
    error("reports", "build --gpu h1000 --model llama-7b --out {out}", says="unknown device 'h1000'"),
    error("reports", "build --gpu a100 --model llama-7b --latency-ms nan --out {out}", says="nan"),
    error("reports", "compare --gpu a100 h100 --model {qwen3_32b_fp8} --out {out}", says="a100-pcie) cannot run"),
    # ---- sensible answers, written whole
    answer(
        "roofline",
        "--gpu a100 --model llama-7b --batch 1 --seq 128 --candidates 1 16 --jobs 1 --out {out}",
        says="roofline.csv",
    ),
    answer("schedule", "--model llama-7b --gpu h100 --max-batch 4 --out {out}", says="vllm"),
)


def materials(folder: Path) -> dict[str, str]:
    """The inputs the cases name, written once into `folder`: today's checkpoints' configs
    (tests/data/model_configs), bad specs and configs of our own."""
    paths = {
        "mixtral": CONFIGS / "mistralai--Mixtral-8x7B-v0.1_config.json",
        "qwen3_30b_a3b": CONFIGS / "Qwen--Qwen3-30B-A3B_config.json",
        "qwen3_235b": CONFIGS / "Qwen--Qwen3-235B-A22B_config.json",
        "gpt_oss_20b": CONFIGS / "openai--gpt-oss-20b_config.json",
        "deepseek_v3": CONFIGS / "deepseek-ai--DeepSeek-V3_config.json",
        "deepseek_v32": CONFIGS / "deepseek-ai--DeepSeek-V3.2_config.json",
        "llama4": CONFIGS / "meta-llama--Llama-4-Scout-17B-16E-Instruct_config.json",
        "qwen3_32b": CONFIGS / "Qwen--Qwen3-32B_config.json",
        "qwen3_32b_fp8": CONFIGS / "Qwen--Qwen3-32B-FP8_config.json",
        "llama70b_fp8": CONFIGS / "nvidia--Llama-3.1-70B-Instruct-FP8_config.json",
        "missing": folder / "missing.json",
    }
    qwen = json.loads(paths["qwen3_32b"].read_text())

    def config(name: str, content: object) -> Path:
        path = folder / name / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content))
        return path.parent

    paths["sliding"] = config("sliding", qwen | {"sliding_window": 4096, "use_sliding_window": True})
    bundled = json.loads((BUNDLED / "config.json").read_text())
    paths["no_heads"] = config("no-heads", bundled | {"medusa_num_heads": 0})
    paths["moe_checkpoint"] = config("moe-checkpoint", bundled | {"num_local_experts": 8, "num_experts_per_tok": 2})
    paths["empty_json"] = config("empty", {})
    paths["not_an_object"] = config("list", [1, 2])
    (folder / "corrupt.json").write_text('{"per_tree_size": [')
    paths["corrupt_json"] = folder / "corrupt.json"

    h100 = yaml.safe_load((SPEC_DIR / "h100-sxm.yaml").read_text())

    def spec(name: str, content: dict) -> Path:
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(content))
        return path

    paths["spec_1e12"] = spec("h100-huge", h100 | {"memory_gb": 1e12})
    paths["spec_bandwidth_bytes"] = spec("h100-bytes", h100 | {"memory_bandwidth_gb_s": 3.35e12})
    paths["spec_peak_flops"] = spec("h100-flops", h100 | {"peak_tflops": h100["peak_tflops"] | {"fp16": 1e15}})
    paths["spec_negative"] = spec("h100-negative", h100 | {"l2_cache_mb": -50})
    (folder / "not-yaml.yaml").write_text("name: [unclosed\n")
    paths["spec_not_yaml"] = folder / "not-yaml.yaml"
    return {key: str(path) for key, path in paths.items()}


@dataclass
class Outcome:
    status: int
    out: str
    err: str
    seconds: float
    left: list[str] = field(default_factory=list)  # files the case's folder holds after it

    def problems(self, case: Case) -> list[str]:
        """What the outcome does wrong for `case` (nothing: it passed)."""
        found = []
        lines = self.err.strip().splitlines()
        if case.answer:
            if self.status != 0:
                found.append(f"exit {self.status}, expected 0: {self.err.strip()[-300:]}")
            elif case.says not in self.out:
                found.append(f"stdout lacks {case.says!r}: {self.out.strip()[-300:]}")
            partial = [p for p in self.left if p.endswith(PARTIAL_SUFFIXES)]
            if partial:
                found.append(f"left partial files: {', '.join(partial)}")
            return found
        if self.status not in (1, 2):
            found.append(f"exit {self.status}, expected an error (1, or 2 for usage)")
        if len(lines) != 1 or "error: " not in lines[0]:
            found.append(f"stderr is not one error line: {self.err.strip()[-400:]!r}")
        elif case.says not in lines[0]:
            found.append(f"the error does not say {case.says!r}: {lines[0]}")
        if self.left:
            found.append(f"left files after an error: {', '.join(self.left[:5])}")
        return found


def command_main(command: str):
    """The main of a command: its module's, or its package's __main__'s (reports, profilers.engine)."""
    module = importlib.import_module(command_code(COMMANDS[command][0]))
    if not hasattr(module, "main"):
        module = importlib.import_module(f"{module.__name__}.__main__")
    return module.main


def run_case(case: Case, shared: dict[str, str], folder: Path) -> Outcome:
    """Run `case` in this process with `folder` (empty) as its working folder."""
    folder.mkdir(parents=True, exist_ok=True)
    names = shared | {"out": str(folder / "out"), "out_file": str(folder / "out" / "sweep.csv")}
    argv = shlex.split(case.line.format(**names))
    out, err = io.StringIO(), io.StringIO()
    main = command_main(case.command)
    started = time.perf_counter()
    with contextlib.chdir(folder), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = run(main, argv)
        except SystemExit as exc:  # argparse's usage errors and --help
            status = exc.code if isinstance(exc.code, int) else 1
    seconds = time.perf_counter() - started
    left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    return Outcome(status, out.getvalue(), err.getvalue(), seconds, left)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.battery", description=__doc__.splitlines()[0])
    parser.add_argument("--only", metavar="TEXT", help="run the cases whose command line holds TEXT")
    parser.add_argument("--verbose", action="store_true", help="print each case's error line or answer's last line")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if args.only is None or args.only in c.name]
    started, failed = time.perf_counter(), 0
    with tempfile.TemporaryDirectory(prefix="battery-") as tmp:
        shared = materials(Path(tmp) / "materials")
        for number, case in enumerate(cases):
            outcome = run_case(case, shared, Path(tmp) / f"case-{number}")
            problems = outcome.problems(case)
            failed += bool(problems)
            verdict = "FAIL" if problems else "ok  "
            expect = "answer" if case.answer else "error "
            print(f"{verdict} {outcome.seconds:5.1f} s  {expect}  {case.name}"[:200])
            for problem in problems:
                print(f"        {problem}")
            if args.verbose and not problems:
                shown = outcome.out.strip().splitlines()[-1:] if case.answer else outcome.err.strip().splitlines()
                print(f"        {shown[0] if shown else ''}"[:300])
            shutil.rmtree(Path(tmp) / f"case-{number}", ignore_errors=True)
    print(
        f"{len(cases) - failed} of {len(cases)} cases answered as they should in {time.perf_counter() - started:.0f} s"
        + (f"; {failed} failed" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
