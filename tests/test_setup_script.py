"""scripts/setup.sh picks llama.cpp build flags from the CPU: AMX CPUs get a non-native build without AMX."""

from __future__ import annotations

import subprocess
from pathlib import Path

SETUP = Path(__file__).resolve().parents[1] / "scripts" / "setup.sh"


def cmake_args(tmp_path: Path, flags: str) -> str:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n")
    out = subprocess.run(
        ["bash", str(SETUP), "--print-cmake-args"],
        env={"EDGE_AGENT_CPUINFO": str(cpuinfo), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, check=True,
    )
    return out.stdout.strip()


def test_amx_cpu_builds_without_amx_but_with_its_vector_units(tmp_path):
    args = cmake_args(tmp_path, "fpu sse avx avx2 fma f16c bmi2 avx512f avx512_vnni avx512_bf16 amx_tile "
                                "amx_int8 amx_bf16")
    assert "-DGGML_NATIVE=OFF" in args
    for off in ("AMX_TILE", "AMX_INT8", "AMX_BF16"):
        assert f"-DGGML_{off}=OFF" in args
    for on in ("AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX512", "AVX512_VNNI", "AVX512_BF16"):
        assert f"-DGGML_{on}=ON" in args.split()
    assert "-DGGML_AVX512_VBMI=ON" not in args  # not advertised, so not assumed


def test_cpu_without_amx_gets_the_native_build(tmp_path):
    assert cmake_args(tmp_path, "fpu sse avx avx2 fma f16c bmi2") == ""
