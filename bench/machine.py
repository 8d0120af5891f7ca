"""Which machine a benchmark's figures came from: lscpu's model name and the flags that decide CPU speed."""

from __future__ import annotations

import os
import subprocess


def machine() -> str:
    """lscpu's model name and the AVX-512 / AVX512-BF16 / AMX flags, as bench/README.md records them."""
    try:
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown CPU"
    name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in cpu.splitlines() if line.startswith("Flags")), [])
    wanted = [flag for flag in flags if flag in ("avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16",
                                                 "amx_tile")]
    return f"{name}, {os.cpu_count()} logical CPUs, flags: {' '.join(wanted) or 'no AVX-512/VNNI/AMX'}"
