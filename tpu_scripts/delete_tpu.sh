#!/usr/bin/env bash
# Delete a TPU VM (or its queued resource). Asks first unless --yes.
#
#   tpu_scripts/delete_tpu.sh --name rljax-v4 --zone us-central2-b [--queued] [--yes] [--dry-run]
#
# Checkpoints written to gs:// survive; anything on the workers' disks is lost.
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"

QUEUED=0
YES=0

while [[ $# -gt 0 ]]; do
  common_flag "$@"
  if (( SHIFT )); then shift "${SHIFT}"; continue; fi
  case "$1" in
    --queued) QUEUED=1; shift ;;
    --yes) YES=1; shift ;;
    *) unknown_argument "$1" ;;
  esac
done
require --name "${TPU_NAME}"
require --zone "${TPU_ZONE}"

if [[ "${YES}" != "1" && "${DRY_RUN}" != "1" ]]; then
  read -r -p "Delete TPU ${TPU_NAME} in ${TPU_ZONE}? [y/N] " answer
  [[ "${answer}" == "y" || "${answer}" == "Y" ]] || { echo "aborted"; exit 1; }
fi
mapfile -t project < <(project_args)
if [[ "${QUEUED}" == "1" ]]; then
  run gcloud compute tpus queued-resources delete "${TPU_NAME}" --zone="${TPU_ZONE}" \
    "${project[@]}" --force --quiet
else
  run gcloud compute tpus tpu-vm delete "${TPU_NAME}" --zone="${TPU_ZONE}" "${project[@]}" --quiet
fi
