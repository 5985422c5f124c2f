import pytest

from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import find_spec, ridge
from perfmodel.latency.roofline_table import Ceiling
from perfmodel.measured.device_view import DeviceView
from perfmodel.planning.simulation_summary import ridge as model_ridge


def test_every_ridge_is_peak_over_bandwidth_of_its_own_roofline():
    spec, params = find_spec("a100"), RooflineParams(compute_efficiency=0.5, memory_efficiency=0.8)
    assert ridge(312e12, 1935e9) == pytest.approx(161.24, abs=0.01)  # the paper's A100 PCIe card
    assert spec.ridge_point("fp16") == ridge(spec.peak_flops("fp16"), spec.bandwidth)
    # Efficiencies move the model's ridge: x0.5 compute over x0.8 bandwidth is 0.625 of the datasheet's.
    assert model_ridge(DeviceView(spec, params), "fp16") == pytest.approx(0.625 * spec.ridge_point("fp16"))
    assert Ceiling("c", 2e12, 4e9).ridge == 500
