#!/usr/bin/env bash
# The GPU acceptance run on a machine with its own PyTorch and no network: the offline install
# from a wheelhouse (tools/install_offline.py), then bench/gpu_check.py. From the checkout:
#
#   bash bench/gpu_acceptance.sh WHEELHOUSE OUT [gpu_check.py options, e.g. --budget-s 330]
#
# OUT gets install.log, gpu_check.json and gpu_check.log. INSTALL_ARGS passes options to the
# installer (e.g. INSTALL_ARGS=--no-deepspeed-ops). Exits with the first failure's status.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bash bench/gpu_acceptance.sh WHEELHOUSE OUT [gpu_check.py options]" >&2
  exit 2
fi
wheelhouse=$1 out=$2
shift 2
cd "$(dirname "$0")/.."
mkdir -p "$out"
PYTHON=${PYTHON:-python3}
SECONDS=0
# shellcheck disable=SC2086 - INSTALL_ARGS is a list of options
"$PYTHON" tools/install_offline.py --wheelhouse "$wheelhouse" ${INSTALL_ARGS:-} 2>&1 \
  | tee "$out/install.log"
status=${PIPESTATUS[0]}
echo "install: exit status $status after ${SECONDS} s" | tee -a "$out/install.log"
[ "$status" -eq 0 ] || exit "$status"
PYTHONUNBUFFERED=1 "$PYTHON" bench/gpu_check.py --out "$out" "$@"
