"""What every test shares: no test reads or writes this user's stored measurements, nor
another test's, so no test depends on the machine it runs on, on what was measured there
before, or on the order tests run in."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile

import pytest
from filelock import FileLock
from helpers import assert_png_shows_a_plot

from perfmodel.cli.parser import COMMAND_GC_THRESHOLD
from perfmodel.measured.store import HOME_VARIABLE
from perfmodel.models.config import ModelConfig
from reports.figure_cache import FOLDER_VARIABLE as FIGURES_VARIABLE
from tests.distilled import distilled_decoder

# Small shapes with GQA and two Medusa heads, shared by the benchmark and sweep tests: every
# op builds in milliseconds.
TINY = ModelConfig(
    "tiny",
    hidden_size=64,
    intermediate_size=96,
    num_heads=4,
    num_kv_heads=2,
    num_layers=1,
    vocab_size=50,
    head_dim=16,
    medusa_heads=2,
)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """The suite in parallel, one worker per core, where pytest-xdist is installed (the test
    extras install it) and no -n was given: `python -m pytest -q` takes half the time on two
    cores, the tests shared out by work stealing. Without it (a GPU machine's bare image), or
    with -n 0, the tests run in turn."""
    if not config.pluginmanager.hasplugin("xdist") or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if config.getoption("numprocesses", None) is not None or config.getoption("collectonly"):
        return
    config.option.numprocesses = "auto"  # xdist's own rule: one worker per physical core
    if config.getoption("dist", "no") == "no":
        # A worker that runs out of tests takes some of the other's not yet started: a few
        # tests take half a minute, and one left near the end would run with a core idle.
        config.option.dist = "worksteal"


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def pytest_collection_modifyitems(config, items):
    """Tests marked long (a real engine serving a load: over a minute) start first: xdist hands
    the first worker the front of the list, and the other runs the rest beside it instead of
    one long test running alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


def pytest_collection_finish(session):
    """What every test module imported (torch, pandas, matplotlib: most of a worker's objects)
    is left out of garbage collections from here on, and the first generation is collected
    every COMMAND_GC_THRESHOLD new objects as in a command (perfmodel.cli.run): each full
    collection would scan them all again for cycles they do not have."""
    gc.freeze()
    gc.set_threshold(COMMAND_GC_THRESHOLD, *gc.get_threshold()[1:])


def pytest_configure(config):
    """Each xdist worker's share of the cores for torch's and numpy's threads, set before the
    workers start (they and their subprocesses inherit it): two workers of two threads each on
    two cores wait on each other (the distilled decoder's fixture took 48 s so, 3 s with one
    thread each). A count the user set is kept; tests that time with every thread set their own
    (profilers.sweep_runs)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    share_figures(config)
    workers = config.getoption("numprocesses", None)
    cores = os.cpu_count() or 1
    workers = cores if workers in ("auto", "logical") else int(workers or 0)
    if workers > 1:
        for name in THREAD_VARIABLES:
            os.environ.setdefault(name, str(max(1, cores // workers)))


def share_figures(config) -> None:
    """One figure cache for the run, shared by its workers (reports.figure_cache): tests that
    build reports draw many of the same figures, and a figure's key is what it shows, so a
    kept one is the bytes drawing gives. Outside the user's cache, removed at the end. A test
    of the drawing itself turns it off (test_figures)."""
    if FIGURES_VARIABLE in os.environ:
        return
    folder = tempfile.mkdtemp(prefix="perfkit-test-figures-")
    os.environ[FIGURES_VARIABLE] = folder
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))


@pytest.fixture(scope="session", autouse=True)
def session_measurements_home(tmp_path_factory):
    """Module fixtures set up before any per-test home: they never reach the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(HOME_VARIABLE, str(tmp_path_factory.mktemp("perfkit-session-home")))
        yield


@pytest.fixture(autouse=True)
def own_measurements_home(session_measurements_home, tmp_path_factory, monkeypatch):
    """A fresh $MEDUSA_PERFKIT_HOME for each test: what --measure stores stays in that test."""
    monkeypatch.setenv(HOME_VARIABLE, str(tmp_path_factory.mktemp("perfkit-home")))


@pytest.fixture(scope="session")
def decoder(tmp_path_factory):
    """The self-distilled small decoder (tests/distilled.py), trained once per test run: the
    first xdist worker to ask trains it, the others read its weights."""
    root = run_folder(tmp_path_factory)
    with FileLock(str(root / "distilled.lock")):
        return distilled_decoder(root / "distilled.pt")


@pytest.fixture
def png_shows_a_plot():
    """The shared PNG check (tests/helpers.py): `png_shows_a_plot(path)` fails unless the file
    is a readable plot, neither blank nor a solid block."""
    return assert_png_shows_a_plot


def deploy(view, model, dtype: str, latency: str = "auto", tp: int = 1, tracer=None):
    """One device's deployment as resolve() builds it (perfmodel.planning.deployment), for the
    tests that price a view and model at one dtype, latency source and degree."""
    from perfmodel.planning.deployment import DeploymentChoices, resolve

    return resolve(model, [view], DeploymentChoices(dtype, tp, latency, tracer=tracer))[0]


def run_folder(tmp_path_factory):
    """A folder of this test run that every xdist worker of it shares (never another run's)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def quick_trained(tmp_path_factory):
    """`python -m decoder.train --quick`'s checkpoint and work folder, trained once per test
    run (the first worker to ask trains, the others wait and read): about 20 s a training.
    Tests take copies (quick_copy), never these folders themselves."""
    from decoder import train
    from perfmodel.cli import run

    root = run_folder(tmp_path_factory)
    out, work, done = root / "quick-model", root / "quick-work", root / "quick.done"
    with FileLock(str(root / "quick.lock")):
        if not done.exists():
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
            assert run(train.main, ["--quick", "--out", str(out), "--work", str(work)]) == 0
            done.touch()
    return out, work


def quick_copy(quick_trained, tmp_path_factory, name: str = "quick"):
    """A copy of the shared quick checkpoint and its work folder, for one module to change."""
    folder = tmp_path_factory.mktemp(name)
    out, work = folder / "model", folder / "work"
    shutil.copytree(quick_trained[0], out)
    shutil.copytree(quick_trained[1], work)
    return out, work
