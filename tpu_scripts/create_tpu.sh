#!/usr/bin/env bash
# Create a Cloud TPU VM (or a queued resource, which waits for capacity).
#
#   tpu_scripts/create_tpu.sh --name rljax-v4 --zone us-central2-b \
#       --accelerator v4-32 --version tpu-ubuntu2204-base [--queued] [--spot] [--dry-run]
#
# Prints the gcloud command before running it; --dry-run only prints it.
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"

TPU_TYPE="${TPU_TYPE:-v4-8}"
TPU_VERSION="${TPU_VERSION:-tpu-ubuntu2204-base}"
QUEUED=0
SPOT=0

while [[ $# -gt 0 ]]; do
  common_flag "$@"
  if (( SHIFT )); then shift "${SHIFT}"; continue; fi
  case "$1" in
    --accelerator) TPU_TYPE="$2"; shift 2 ;;
    --version) TPU_VERSION="$2"; shift 2 ;;
    --queued) QUEUED=1; shift ;;
    --spot) SPOT=1; shift ;;
    *) unknown_argument "$1" ;;
  esac
done
require --name "${TPU_NAME}"
require --zone "${TPU_ZONE}"

args=(--zone="${TPU_ZONE}" --accelerator-type="${TPU_TYPE}")
mapfile -t project < <(project_args)
args+=("${project[@]}")
if [[ "${SPOT}" == "1" ]]; then
  args+=(--spot)
fi

if [[ "${QUEUED}" == "1" ]]; then
  echo "Queueing TPU ${TPU_NAME} (${TPU_TYPE}, runtime ${TPU_VERSION}) in ${TPU_ZONE}"
  run gcloud compute tpus queued-resources create "${TPU_NAME}" --node-id="${TPU_NAME}" \
    --runtime-version="${TPU_VERSION}" "${args[@]}"
  echo "Watch it with: gcloud compute tpus queued-resources describe ${TPU_NAME} --zone=${TPU_ZONE}"
else
  echo "Creating TPU VM ${TPU_NAME} (${TPU_TYPE}, runtime ${TPU_VERSION}) in ${TPU_ZONE}"
  run gcloud compute tpus tpu-vm create "${TPU_NAME}" --version="${TPU_VERSION}" "${args[@]}"
fi
