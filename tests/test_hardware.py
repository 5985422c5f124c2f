import pytest

from hw_specs import SPEC_DIR
from perfmodel.base.errors import PerfkitError
from perfmodel.hardware.specs import OPTIONAL_NUMBERS, find_spec, load_all_specs, load_spec_file, resolve_spec
from tests.helpers import custom_spec

# Datasheet figures (sources in each hw_specs/*.yaml): FP16 tensor TFLOP/s, FP32, bandwidth GB/s, memory GB,
# L2 MB, SMs.
DATASHEET_TABLE = {
    "a100": (312, 19.5, 1935, 80, 40, 108),
    "a100-sxm": (312, 19.5, 2039, 80, 40, 108),
    "a40": (149.7, 37.4, 696, 48, 6, 84),
    "rtx-a6000": (154.8, 38.7, 768, 48, 6, 84),
    "l40s": (362, 91.6, 864, 48, 96, 142),
    "h100-sxm": (989, 67, 3350, 80, 50, 132),
    "h100-pcie": (756, 51, 2000, 80, 50, 114),
    "h200": (989, 67, 4800, 141, 50, 132),
    "rtx-4090": (165.2, 82.6, 1008, 24, 72, 128),
    "rtx-3090": (71, 35.6, 936, 24, 6, 82),
}


@pytest.mark.parametrize("name", DATASHEET_TABLE)
def test_shipped_specs_match_the_design_table(name):
    fp16, fp32, bw, mem, l2, sms = DATASHEET_TABLE[name]
    spec = find_spec(name)
    assert spec.peak_tflops["fp16"] == fp16
    assert spec.peak_tflops["bf16"] == fp16
    assert spec.peak_tflops["fp32"] == fp32
    assert (spec.memory_bandwidth_gb_s, spec.memory_gb, spec.l2_cache_mb, spec.sm_count) == (bw, mem, l2, sms)


def test_every_shipped_spec_is_complete_sourced_and_consistent():
    specs = load_all_specs()
    assert len(specs) == len(list(SPEC_DIR.glob("*.yaml"))) == 15
    for spec in specs.values():
        for field in OPTIONAL_NUMBERS:
            assert getattr(spec, field) is not None, f"{spec.key}: {field}"
            assert "http" in spec.source_of(field), f"{spec.key}: {field} has no URL"
        for dtype in spec.peak_tflops:
            assert "http" in spec.source_of(f"peak_tflops.{dtype}")
        # Datasheet bandwidth agrees with 2 x memory clock x bus width / 8.
        assert spec.computed_bandwidth_gb_s == pytest.approx(spec.memory_bandwidth_gb_s, rel=0.03), spec.key


def test_a100_is_the_papers_pcie_card_and_its_ridge_point():
    spec = find_spec("a100")
    assert spec.key == "a100-pcie"
    assert spec.ridge_point("fp16") == pytest.approx(312e12 / 1935e9)
    assert spec.computed_bandwidth_gb_s == pytest.approx(1935, abs=1)
    assert find_spec("a100-sxm").computed_bandwidth_gb_s == pytest.approx(2039, abs=1)


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA A100 80GB PCIe", "a100-pcie"),
        ("A100_PCIE", "a100-pcie"),
        (" H100 ", "h100-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("4090", "rtx-4090"),
    ],
)
def test_names_resolve_case_and_separator_insensitively(name, key):
    assert find_spec(name).key == key  # NVML names included, so profilers can match the GPU they run on


def test_nvml_name_of_h100_sxm_is_the_h100_alias():
    assert find_spec("NVIDIA H100 80GB HBM3").key == find_spec("h100").key == "h100-sxm"


def test_unknown_device_lists_the_known_ones_and_the_closest():
    with pytest.raises(PerfkitError) as err:
        find_spec("h10")
    message = str(err.value)
    assert "unknown device 'h10'" in message
    assert all(key in message for key in DATASHEET_TABLE if "-" in key)
    assert "closest match: h100" in message


def test_missing_dtype_names_what_the_device_has():
    with pytest.raises(PerfkitError, match="no fp8 peak.*fp16, bf16"):
        find_spec("a100").peak_flops("fp8")
    assert find_spec("h100").peak_flops("fp8") == 1979e12


def test_custom_spec_file_loads(tmp_path):
    path = custom_spec(tmp_path, memory_bandwidth_gb_s=1000)
    spec = resolve_spec(spec=path)
    assert spec.name == "My Accelerator" and spec.key == "my-gpu"
    assert spec.bandwidth == 1e12


def test_a_minimal_custom_spec_needs_only_the_roofline_numbers(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "name: Tiny\nmemory_gb: 8\nmemory_bandwidth_gb_s: 100\npeak_tflops: {fp16: 10}\n"
        "sources: {memory_gb: my notes, memory_bandwidth_gb_s: my notes, peak_tflops: my notes}\n"
    )
    spec = load_spec_file(path)
    assert spec.ridge_point("fp16") == 100
    assert spec.sm_count is None


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"memory_bandwidth_gb_s": None}, "missing field 'memory_bandwidth_gb_s'"),
        ({"memory_gb": "lots"}, "field 'memory_gb' must be a number, got 'lots'"),
        ({"sm_count": -84}, "field 'sm_count' must be positive, got -84"),
        ({"peak_tflops": {"fp16": 0}}, "field 'peak_tflops.fp16' must be positive"),
        ({"peak_tflops": {"fp64": 1.0}}, "'peak_tflops.fp64': unknown dtype"),
        ({"sources": {"memory_gb": "x"}}, "has no entry in 'sources'"),
        ({"warp_size": 32}, "unknown field"),
    ],
)
def test_bad_spec_fields_name_the_file_and_the_field(tmp_path, changes, message):
    path = custom_spec(tmp_path, **changes)
    with pytest.raises(PerfkitError, match=message) as err:
        load_spec_file(path)
    assert str(path) in str(err.value)


def test_unreadable_and_invalid_spec_files(tmp_path):
    with pytest.raises(PerfkitError, match="cannot read spec file"):
        load_spec_file(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(PerfkitError, match="not valid YAML"):
        load_spec_file(broken)


def test_a_new_device_is_one_yaml_file(tmp_path):
    for path in SPEC_DIR.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    custom_spec(tmp_path, aliases=["myacc"])
    assert find_spec("myacc", spec_dir=tmp_path).name == "My Accelerator"


def test_two_devices_claiming_one_alias_is_an_error(tmp_path):
    for path in SPEC_DIR.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    custom_spec(tmp_path, aliases=["a100"])
    with pytest.raises(PerfkitError, match="'a100' is claimed by both"):
        find_spec("a40", spec_dir=tmp_path)


def test_specs_are_parsed_once_per_process():
    from perfmodel.hardware.specs import parsed_yaml

    load_all_specs()
    misses = parsed_yaml.cache_info().misses
    for _ in range(3):
        load_all_specs()
        find_spec("a100")
    assert parsed_yaml.cache_info().misses == misses


def test_an_edited_spec_is_reread_even_at_the_same_size_and_time(tmp_path):
    import os

    path = tmp_path / "tiny.yaml"
    text = (
        "name: Tiny\nmemory_gb: 8\nmemory_bandwidth_gb_s: 100\npeak_tflops: {fp16: 10}\n"
        "sources: {memory_gb: my notes, memory_bandwidth_gb_s: my notes, peak_tflops: my notes}\n"
    )
    path.write_text(text)
    stat = path.stat()
    assert load_spec_file(path).peak_tflops["fp16"] == 10
    path.write_text(text.replace("fp16: 10", "fp16: 20"))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # a same-size edit within the clock's resolution
    assert load_spec_file(path).peak_tflops["fp16"] == 20


def test_each_load_returns_its_own_spec():
    # The parse is shared; what a caller gets is not, so changing it cannot change the next load.
    spec = find_spec("a100")
    spec.peak_tflops["fp16"] = 1.0
    spec.sources.clear()
    again = find_spec("a100")
    assert again.peak_tflops["fp16"] == 312 and again.sources
