"""Device and link profiles."""

from simulator.hardware.profiles import DeviceProfile, Efficiency, EfficiencyCurve, LinkProfile
from simulator.hardware.registry import device_names, link_names, load_device, load_link

__all__ = [
    "DeviceProfile",
    "Efficiency",
    "EfficiencyCurve",
    "LinkProfile",
    "device_names",
    "link_names",
    "load_device",
    "load_link",
]
