"""What machine a benchmark ran on, recorded the same way in every result file.

    from machine_facts import machine_facts
    result = {"machine": machine_facts(), ...}

CPUs of one name ("AMD EPYC" in a VM) span generations whose vector units differ by 2x, so a
result names the CPU by vendor, family, model and stepping (from /proc/cpuinfo, which reports
what CPUID says), the ISA flags that decide LibTorch's and the library's code paths, and the
microarchitecture where the family/model pair is one we know. The load average at the start says
whether the machine was quiet.
"""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

# The ISA flags that change which code runs (vector width, dot-product instructions, tiles).
_ISA_PREFIXES = ("avx", "amx")
_ISA_EXTRA = ("fma", "f16c")

# (vendor, family, first model, last model) -> microarchitecture, from the vendors' published
# family/model numbers. A VM may report a made-up model; an unknown pair reads "".
_MICROARCH = [
    ("AuthenticAMD", 0x17, 0x00, 0x0F, "Zen 1 / Zen+"),
    ("AuthenticAMD", 0x17, 0x10, 0x2F, "Zen 1 / Zen+"),
    ("AuthenticAMD", 0x17, 0x30, 0x3F, "Zen 2"),
    ("AuthenticAMD", 0x17, 0x60, 0x7F, "Zen 2"),
    ("AuthenticAMD", 0x17, 0x90, 0x9F, "Zen 2"),
    ("AuthenticAMD", 0x19, 0x00, 0x0F, "Zen 3"),
    ("AuthenticAMD", 0x19, 0x20, 0x5F, "Zen 3"),
    ("AuthenticAMD", 0x19, 0x10, 0x1F, "Zen 4"),
    ("AuthenticAMD", 0x19, 0x60, 0x7F, "Zen 4"),
    ("AuthenticAMD", 0x19, 0xA0, 0xAF, "Zen 4"),
    ("AuthenticAMD", 0x1A, 0x00, 0xFF, "Zen 5"),
    ("GenuineIntel", 6, 0x55, 0x55, "Skylake-SP / Cascade Lake"),
    ("GenuineIntel", 6, 0x6A, 0x6A, "Ice Lake-SP"),
    ("GenuineIntel", 6, 0x8F, 0x8F, "Sapphire Rapids"),
    ("GenuineIntel", 6, 0xCF, 0xCF, "Emerald Rapids"),
    ("GenuineIntel", 6, 0xAD, 0xAD, "Granite Rapids"),
]


def microarchitecture(vendor: str, family: int, model: int) -> str:
    for v, fam, lo, hi, name in _MICROARCH:
        if v == vendor and fam == family and lo <= model <= hi:
            return name
    return ""


def parse_cpuinfo(text: str) -> dict:
    """The first processor's entry of a /proc/cpuinfo text."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())

    def num(key: str) -> int:
        try:
            return int(fields.get(key, ""), 0)
        except ValueError:
            return -1

    flags = fields.get("flags", "").split()
    vendor = fields.get("vendor_id", "")
    family, model = num("cpu family"), num("model")
    return {
        "name": fields.get("model name", "unknown"),
        "vendor": vendor,
        "family": family,
        "model": model,
        "stepping": num("stepping"),
        "microarchitecture": microarchitecture(vendor, family, model),
        "isa_flags": [f for f in flags if f.startswith(_ISA_PREFIXES) or f in _ISA_EXTRA],
    }


def machine_facts(extra_versions: dict[str, str] | None = None) -> dict:
    """CPU identity and flags, cores, memory, load average, OS and library versions."""
    try:
        cpu = parse_cpuinfo(Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace"))
    except OSError:
        cpu = parse_cpuinfo("")
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except (OSError, ValueError):
        pass
    versions = {"python": platform.python_version()}
    try:
        import torch

        versions["torch"] = torch.__version__
        versions["torch_threads"] = str(torch.get_num_threads())
        config = torch.__config__.show()
        for key, pattern in (("mkl", r"Math Kernel Library Version (\S+)"),
                             ("onednn", r"MKL-DNN (v[0-9.]+)"),
                             ("cpu_capability", r"CPU capability usage: (\S+)")):
            found = re.search(pattern, config)
            versions[key] = found.group(1) if found else "none"
    except ImportError:
        pass
    versions.update(extra_versions or {})
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 2**20, 1),
        "load_average": list(os.getloadavg()),
        "os": platform.platform(),
        "versions": versions,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(machine_facts(), indent=1))
