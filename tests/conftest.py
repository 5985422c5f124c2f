"""What every test shares: no test reads or writes this user's stored measurements, so no
test depends on the machine it runs on or on what was measured there before."""

from __future__ import annotations

import pytest

from profilers.store import HOME_VARIABLE


@pytest.fixture(scope="session", autouse=True)
def own_measurements_home(tmp_path_factory):
    """A fresh $MEDUSA_PERFKIT_HOME for the session: --measure stores sweeps there."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(HOME_VARIABLE, str(tmp_path_factory.mktemp("perfkit-home")))
        yield
