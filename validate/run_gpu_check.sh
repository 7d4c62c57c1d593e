#!/usr/bin/env bash
# The GPU check, as one command on a fresh CUDA machine (an H200 is what the targets are set for):
#
#     bash validate/run_gpu_check.sh [OUT]          # the measurement folder OUT (default gpu-check-<date>)
#     bash validate/run_gpu_check.sh --pack DIR     # for a remote runner: five flat files in DIR (below)
#
# It installs nothing and reaches no network: it needs Python with torch (CUDA), numpy and pyyaml (it finds one
# among python3 and python, or takes PYTHON), and this checkout (SimPy is not needed to measure). It records the
# machine's state (GPU clocks, power, PCIe link, driver, versions) before and after, calibrates (microbenchmarks),
# runs the executor over the GPU suite (Switch-XXL experts: several policies x batch sizes x cache sizes; at the
# end, hybrid configurations whose experts off the GPU are computed on the host CPU, where this version registers
# their policies, and two quantized ones: the experts held int8 and packed int4 at the simulator's bytes and
# de-quantized on the GPU before their GEMMs, the de-quantization timed per format by the microbenchmarks), and
# leaves the measurement folder. With --pack DIR the folder is packed, and DIR receives exactly:
#
#     gpu-check.tar.gz   the measurement folder (env-before.txt and env-after.txt inside)
#     calibration.yaml   the microbenchmarks' calibration profile (with the dequant_int8/dequant_int4 tables)
#     run.log            everything the measurement printed
#     env-before.txt     the machine's state before, and after: env-after.txt
#
# Then, on any machine with the project installed:
#
#     python -m validate compare gpu-check.tar.gz   # or the folder; error table in gpu-check/compare/
#
# Environment: PYTHON (a Python with torch, numpy, pyyaml), DEVICE (default cuda; cpu runs the same path on the
# CPU, for testing the script), LIMIT_S (default 330: the measurement stops there, keeping its finished
# configurations), ROUNDS (default 2), HOST_THREADS (worker threads computing experts on the host CPU; default: the
# cores left beside the compute and copy threads), EXTRA (more arguments for `python -m validate gpu`, e.g.
# "--quick" or "--configs on-demand-b8,diffmoe-b16-c6").
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1

PACK=
if [[ "${1:-}" == --pack ]]; then
    PACK="${2:?usage: run_gpu_check.sh --pack DIR}"
    mkdir -p "$PACK" || exit 2
    WORK="$(mktemp -d)"
    OUT="$WORK/gpu-check"
else
    OUT="${1:-gpu-check-$(date -u +%Y%m%d-%H%M%S)}"
fi
DEVICE="${DEVICE:-cuda}"
LIMIT_S="${LIMIT_S:-330}"
ROUNDS="${ROUNDS:-2}"

if [[ -z "${PYTHON:-}" ]]; then
    for p in python3 python; do
        if command -v "$p" >/dev/null && "$p" -c 'import torch, numpy, yaml' 2>/dev/null; then PYTHON="$p"; break; fi
    done
fi
PYTHON="${PYTHON:-python3}"

"$PYTHON" - "$DEVICE" <<'EOF' || exit 2
import sys
try:
    import numpy, torch, yaml  # noqa: F401
except ImportError as exc:
    sys.exit(f"error: {exc.name} is missing: the GPU check needs Python with torch, numpy and pyyaml")
device = sys.argv[1]
if device.startswith("cuda") and not torch.cuda.is_available():
    sys.exit("error: DEVICE: CUDA is not available here (torch %s); DEVICE=cpu runs the CPU path" % torch.__version__)
name = torch.cuda.get_device_name(device) if device.startswith("cuda") else "CPU"
print(f"GPU check on {name}, torch {torch.__version__}")
EOF

machine_state() {  # what the figures depend on; every part is optional
    date -u
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi
        nvidia-smi --query-gpu=name,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,power.limit,temperature.gpu,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max --format=csv
        nvidia-smi -q -d CLOCK,POWER,PERFORMANCE,TEMPERATURE
        nvidia-smi topo -m
    else
        echo "nvidia-smi: not found"
    fi
    free -g; nproc; uptime
    "$PYTHON" -c 'import sys, torch, numpy, yaml; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "numpy", numpy.__version__, "yaml", yaml.__version__); print(torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA", torch.cuda.mem_get_info() if torch.cuda.is_available() else "")'
}

mkdir -p "$OUT" || exit 2
machine_state >"$OUT/env-before.txt" 2>&1
suite=gpu
[[ "$DEVICE" == cpu ]] && suite=cpu
start=$(date +%s)
status=0
# shellcheck disable=SC2086
timeout -k 20 --signal=INT "$LIMIT_S" "$PYTHON" -m validate gpu --out "$OUT" --device "$DEVICE" --suite "$suite" \
    --rounds "$ROUNDS" ${HOST_THREADS:+--host-threads "$HOST_THREADS"} ${EXTRA:-} 2>&1 | tee "$OUT/run.log"
status=${PIPESTATUS[0]}
echo "measurement took $(( $(date +%s) - start )) s (exit status $status); folder: $OUT" | tee -a "$OUT/run.log"
if [[ $status -ne 0 ]]; then
    echo "stopped early: the finished configurations are in $OUT; rerun with EXTRA=--resume to finish" \
        | tee -a "$OUT/run.log"
fi
machine_state >"$OUT/env-after.txt" 2>&1

if [[ -n "$PACK" ]]; then
    tar czf "$PACK/gpu-check.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
    for f in calibration.yaml run.log env-before.txt env-after.txt; do
        [[ -f "$OUT/$f" ]] && cp "$OUT/$f" "$PACK/"
    done
    rm -rf "$WORK"
    ls -la "$PACK"
    echo "next, where the project is installed: python -m validate compare gpu-check.tar.gz"
else
    echo "next: python -m validate compare $OUT"
fi
exit $status
