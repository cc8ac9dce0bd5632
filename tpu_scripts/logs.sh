#!/usr/bin/env bash
# Stream the log of a detached run (launch.sh --detach) from the TPU workers.
#
#   tpu_scripts/logs.sh --name rljax-v4 --zone us-central2-b [--worker 0|all] \
#       [--lines 200] [--log runs/grpo-v4.log] [--dry-run]
#
# Follows ~/rljax-run.log on the chosen worker(s) (default: worker 0, which prints the
# metrics) and appends what it shows to --log when given.
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"

WORKER=0
LINES=200
LOG=""
REMOTE_LOG="rljax-run.log"

while [[ $# -gt 0 ]]; do
  common_flag "$@"
  if (( SHIFT )); then shift "${SHIFT}"; continue; fi
  case "$1" in
    --worker) WORKER="$2"; shift 2 ;;
    --lines) LINES="$2"; shift 2 ;;
    --log) LOG="$2"; shift 2 ;;
    *) unknown_argument "$1" ;;
  esac
done
require --name "${TPU_NAME}"
require --zone "${TPU_ZONE}"
[[ "${LINES}" =~ ^[0-9]+$ ]] || die "--lines must be a number, got ${LINES}"

remote="tail -n ${LINES} -F ~/${REMOTE_LOG}"
if [[ -n "${LOG}" && "${DRY_RUN}" != "1" ]]; then
  mkdir -p "$(dirname "${LOG}")"
  tpu_ssh "${remote}" "${WORKER}" 2>&1 | tee -a "${LOG}"
else
  tpu_ssh "${remote}" "${WORKER}"
fi
