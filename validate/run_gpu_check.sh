#!/usr/bin/env bash
# The GPU check, as one command on a fresh CUDA machine (an H200 is what the targets are set for):
#
#     bash validate/run_gpu_check.sh [OUT]          # OUT defaults to gpu-check-<date>
#
# It installs nothing and reaches no network: it needs Python with torch (CUDA), numpy and pyyaml, and this
# checkout (SimPy is not needed to measure). It calibrates (microbenchmarks), runs the executor over the GPU suite
# (Switch-XXL experts, several policies x batch sizes x cache sizes), and leaves the measurement folder OUT.
# Then, on any machine with the project installed:
#
#     python -m validate compare OUT                # error table: OUT/compare/compare.{csv,md,png}
#
# Environment: PYTHON (default python3), DEVICE (default cuda; cpu runs the same path on the CPU, for testing the
# script), LIMIT_S (default 330: the measurement stops there, keeping its finished configurations), EXTRA (more
# arguments for `python -m validate gpu`, e.g. "--quick" or "--configs on-demand-b8,diffmoe-b16-c6").
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-gpu-check-$(date -u +%Y%m%d-%H%M%S)}"
PYTHON="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
LIMIT_S="${LIMIT_S:-330}"

"$PYTHON" - "$DEVICE" <<'EOF'
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

suite=gpu
[[ "$DEVICE" == cpu ]] && suite=cpu
start=$(date +%s)
# shellcheck disable=SC2086
status=0
timeout -k 20 --signal=INT "$LIMIT_S" "$PYTHON" -m validate gpu --out "$OUT" --device "$DEVICE" --suite "$suite" \
    ${EXTRA:-} || status=$?
echo "measurement took $(( $(date +%s) - start )) s (exit status $status); folder: $OUT"
if [[ $status -ne 0 ]]; then
    echo "stopped early: the finished configurations are in $OUT; rerun with EXTRA=--resume to finish"
fi
echo "next: python -m validate compare $OUT"
exit $status
