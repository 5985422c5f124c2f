"""What every test shares: no test reads or writes this user's stored measurements, nor
another test's, so no test depends on the machine it runs on, on what was measured there
before, or on the order tests run in."""

from __future__ import annotations

import pytest

from profilers.store import HOME_VARIABLE


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
