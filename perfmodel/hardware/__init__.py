"""Devices: datasheet specs (hw_specs/), this machine's CPU identity, measured ceilings and
the roofline's efficiency factors."""

from perfmodel.hardware.efficiencies import RooflineParams
from perfmodel.hardware.specs import HardwareSpec, find_spec, load_all_specs, load_spec_file, resolve_spec

__all__ = ["HardwareSpec", "RooflineParams", "find_spec", "load_all_specs", "load_spec_file", "resolve_spec"]
