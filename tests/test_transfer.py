"""GEMM latency transferred to devices without measurements (perfmodel.latency.transfer), its
leave-one-device-out check (python -m perfmodel.transfer_check) and the spec fields it reads."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pandas as pd
import pytest

from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import MEMORY_TYPES, find_spec, load_all_specs, parse_spec
from perfmodel.latency.gemm_grid import ENGINES, gemm_grid
from perfmodel.latency.transfer import (
    engine_stacks,
    leave_one_device_out,
    roofline,
    transferred_gemm,
)
from perfmodel.transfer_check import main as transfer_check

MEASURED = ("a100-sxm", "b200", "b300", "gb200", "gb300", "h100-sxm", "h200", "l40s", "rtx-pro-6000")
# Devices with another of their generation and memory family among the donors (the Blackwell
# HBM3e four, the Hopper two); the others are alone in theirs.
PAIRED = ("b200", "b300", "gb200", "gb300", "h100-sxm", "h200")
# The acceptance line (issues 24 and 41): median <= 10% per device, leave one device out, vLLM's grids.
# Measured on the shipped grids (docs/results/leave-one-device-out.md), three devices miss it, each
# alone in its generation and memory family: the A100 (Ampere, HBM2e), the L40S (Ada, GDDR6) and
# the RTX Pro 6000 (GDDR7 on a workstation Blackwell die, whose GEMMs reach 0.91 of its datasheet
# bandwidth where the L40S's reach 0.81). strict: the day they meet it, this test says so.
SHORT_OF_THE_LINE = {"a100-sxm": "10.4% measured", "l40s": "13.4% measured", "rtx-pro-6000": "17.0% measured"}


def errors(engine: str) -> dict:
    return {e.device: e for e in leave_one_device_out(engine)}


@pytest.mark.parametrize(
    "device",
    [
        pytest.param(d, marks=pytest.mark.xfail(strict=True, reason=SHORT_OF_THE_LINE[d]))
        if d in SHORT_OF_THE_LINE
        else d
        for d in MEASURED
    ],
)
def test_leave_one_device_out_median_is_within_ten_percent_on_vllm(device):
    assert errors("vllm")[device].median <= 0.10


@pytest.mark.parametrize("engine", ENGINES)
def test_every_held_out_device_is_predicted_and_a_paired_one_beats_the_datasheet(engine):
    found = errors(engine)
    assert set(found) == set(MEASURED)
    for e in found.values():
        assert e.points > 4000, e  # the check compares thousands of measured grid points
        assert e.device not in [d.split()[0] for d in e.donors.split(", ")]  # predicted from the others only
        assert e.median <= (0.10 if e.device in PAIRED else 0.20), e  # a sibling of its generation lends most
    # Over the paired devices the datasheet roofline's worst median is well above the transfer's.
    paired = [found[d] for d in PAIRED]
    assert max(e.median for e in paired) < 0.7 * max(e.datasheet_median for e in paired)


def test_a_device_never_lends_to_itself_and_exclude_removes_donors():
    transfer = transferred_gemm("h100-sxm", "vllm", "fp16")
    assert {d.spec.key for d in transfer.donors} == set(MEASURED) - {"h100-sxm"}
    assert sum(d.weight for d in transfer.donors) == pytest.approx(1.0)
    assert transfer.donors[0].spec.key == "h200"  # the same GH100 die weighs most
    without = transferred_gemm("h100", "vllm", "fp16", exclude=("h200",))  # names and aliases both work
    assert {d.spec.key for d in without.donors} == set(MEASURED) - {"h100-sxm", "h200"}
    assert without.time(4096, 4096, 16) != pytest.approx(transfer.time(4096, 4096, 16), rel=0.01)


def test_no_donor_left_or_no_grid_of_the_dtype_gives_none_and_an_unknown_engine_is_refused():
    assert transferred_gemm("a40", "vllm", "fp16", exclude=MEASURED) is None
    assert transferred_gemm("h200", "trtllm", "bf16", exclude=tuple(d for d in MEASURED if d != "h200")) is None
    assert transferred_gemm("a40", "vllm", "fp32") is None  # the grids hold 16-bit GEMMs
    with pytest.raises(PerfkitError, match="engine 'tensorrt'.*choose from: vllm, sglang, trtllm"):
        transferred_gemm("a40", "tensorrt", "fp16")


def test_an_identical_device_gets_the_donors_grid_back():
    spec = find_spec("h100-sxm")
    twin = dataclasses.replace(spec, key="h100-twin", name="twin")
    transfer = transferred_gemm(twin, "vllm", "fp16", exclude=tuple(d for d in MEASURED if d != "h100-sxm"))
    grid = gemm_grid("h100-sxm", engine_stacks("vllm")["h100-sxm"], "fp16")
    k, n, m = np.array([4096, 8192, 1024]), np.array([11008, 4096, 28672]), np.array([1, 257, 4096])
    np.testing.assert_allclose(transfer.time(k, n, m), grid.time(k, n, m), rtol=1e-9)


def test_bandwidth_moves_memory_bound_gemms_and_the_sustained_clock_compute_bound_ones():
    spec = find_spec("a40")
    slow_memory = dataclasses.replace(spec, memory_bandwidth_gb_s=spec.memory_bandwidth_gb_s / 2)
    slow_clock = dataclasses.replace(spec, sustained_clock_mhz=spec.sustained_clock_mhz / 2)
    base, memory, clock = (transferred_gemm(s, "vllm", "fp16") for s in (spec, slow_memory, slow_clock))
    decode, prefill = (8192, 8192, 1), (8192, 8192, 8192)  # (k, n, m)
    assert memory.time(*decode) / base.time(*decode) == pytest.approx(2.0, rel=0.1)
    assert memory.time(*prefill) / base.time(*prefill) < 1.2
    assert clock.time(*prefill) / base.time(*prefill) == pytest.approx(2.0, rel=0.1)
    assert clock.time(*decode) / base.time(*decode) < 1.1


def test_the_kernel_floor_is_counted_in_cycles_of_the_targets_clock():
    spec = find_spec("a40")
    base = transferred_gemm(spec, "vllm", "fp16")
    half_clock = transferred_gemm(
        dataclasses.replace(spec, sustained_clock_mhz=spec.sustained_clock_mhz / 2), "vllm", "fp16"
    )
    assert half_clock.floor_s == pytest.approx(2 * base.floor_s)
    assert half_clock.time(256, 256, 1) / base.time(256, 256, 1) == pytest.approx(2.0, rel=0.15)  # a tiny GEMM
    # The measured floors the cycles come from: the A100's tiny GEMMs are the slowest, at the lowest clock.
    floors = {d.spec.key: d.floor_s for d in transferred_gemm("a40", "vllm", "fp16").donors}
    assert floors["a100-sxm"] > 1.3 * floors["h100-sxm"] > 1.3 * 2e-6
    assert "kernel floor" in base.label


def test_wave_quantization_charges_a_part_empty_last_wave():
    a100 = find_spec("a100-sxm")  # 108 SMs: 128 tiles of 128 x 128 take two waves
    two_waves = roofline(a100, 0.7, np.array(1024.0), np.array(2048.0), np.array(8192.0))
    one_wave = roofline(a100, 0.7, np.array(768.0), np.array(2048.0), np.array(8192.0))  # 96 tiles
    assert two_waves / one_wave > 1.5


def test_the_a40_and_rtx_a6000_rest_on_the_a100_and_the_gddr6_share_and_say_so():
    for name in ("a40", "rtx-a6000"):
        transfer = transferred_gemm(name, "vllm", "fp16")
        assert transfer.donors[0].spec.key == "a100-sxm"  # the same Ampere generation
        assert transfer.share_basis == "l40s"  # the one measured GDDR6 device
        label = transfer.label
        assert label.startswith(f"GEMMs transferred to {transfer.spec.key} from a100-sxm (vllm 0.14.0, weight 0.84)")
        assert "GDDR6 bandwidth share 0.81 of l40s" in label
        assert "leave-one-device-out median 4-17%" in label
        # Between the memory-bound floor and the compute ceiling of its own spec.
        spec = transfer.spec
        t = transfer.time(4096, 4096, np.array([1, 8192]))
        assert 2 * 4096 * 4096 / spec.bandwidth < t[0] < 3 * 2 * 4096 * 4096 / spec.bandwidth
        assert 2 * 8192 * 4096 * 4096 / spec.sustained_flops("fp16") < t[1]


def test_every_spec_has_a_sourced_memory_type_tensor_clock_and_sustained_clock():
    for spec in load_all_specs().values():
        assert spec.memory_type in MEMORY_TYPES, spec.key
        assert spec.sustained_clock_mhz <= spec.tensor_clock_mhz <= spec.boost_clock_mhz, spec.key
        for field in ("memory_type", "tensor_clock_mhz", "sustained_clock_mhz"):
            assert "http" in spec.source_of(field), f"{spec.key}: {field}"
    assert find_spec("l40s").sustained_flops("bf16") == pytest.approx(362e12 * 2040 / 2520)
    assert find_spec("h100-sxm").sustained_flops("bf16") == pytest.approx(989e12)  # tensor cores boost to 1830


def test_an_unknown_memory_type_names_the_allowed_ones(tmp_path):
    data = {
        "name": "x",
        "memory_gb": 1,
        "memory_bandwidth_gb_s": 1,
        "peak_tflops": {"fp16": 1},
        "memory_type": "HBM4x",
        "sources": {"memory_gb": "a", "memory_bandwidth_gb_s": "a", "peak_tflops": "a", "memory_type": "a"},
    }
    with pytest.raises(PerfkitError, match="'memory_type' is 'HBM4x'; allowed: HBM2, HBM2e"):
        parse_spec(data, tmp_path / "x.yaml")


def test_transfer_check_prints_every_engine_and_writes_its_table(tmp_path, capsys):
    out = tmp_path / "lodo.csv"
    assert transfer_check(["--stack", "vllm", "--csv", str(out)]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"^ *vllm +a100-sxm +vllm-0\.14\.0 +4704 ", shown, re.M), shown
    assert "Devices without a grid borrow" in shown
    table = pd.read_csv(out)
    assert list(table["device"]) == list(MEASURED)
    assert (table["median"] < table["datasheet_median"]).sum() >= 3


def test_a_spec_without_sm_count_or_sustained_clock_still_transfers_on_its_peak():
    bare = dataclasses.replace(find_spec("a40"), key="my-card", sm_count=None, sustained_clock_mhz=None)
    assert bare.sustained_flops("fp16") == bare.peak_flops("fp16")
    t = transferred_gemm(bare, "vllm", "fp16").time(4096, 4096, np.array([1, 4096]))
    assert np.all(np.isfinite(t)) and t[1] > t[0]
