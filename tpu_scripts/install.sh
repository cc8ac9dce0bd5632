#!/usr/bin/env bash
# Install JAX for TPU and rljax (from a git URL and branch) on every worker of a TPU VM.
#
#   tpu_scripts/install.sh --name rljax-v4 --zone us-central2-b \
#       --repo https://github.com/OWNER/rljax.git [--branch main] [--dry-run]
#
# rljax is cloned to ~/rljax on each worker and installed editable, so launch.sh can
# run experiment files from the checkout.
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"

REPO="${RLJAX_REPO:-}"
BRANCH="${RLJAX_BRANCH:-main}"

while [[ $# -gt 0 ]]; do
  common_flag "$@"
  if (( SHIFT )); then shift "${SHIFT}"; continue; fi
  case "$1" in
    --repo) REPO="$2"; shift 2 ;;
    --branch) BRANCH="$2"; shift 2 ;;
    *) unknown_argument "$1" ;;
  esac
done
require --name "${TPU_NAME}"
require --zone "${TPU_ZONE}"
require --repo "${REPO}"

remote="set -euo pipefail
python3 -m pip install --quiet --upgrade pip
python3 -m pip install --quiet 'jax[tpu]'
rm -rf ~/rljax
git clone --depth 1 --branch $(printf '%q' "${BRANCH}") $(printf '%q' "${REPO}") ~/rljax
python3 -m pip install --quiet -e ~/rljax
python3 -c 'import jax, rljax; print(jax.process_index(), jax.local_device_count(), jax.devices()[0].platform)'"

echo "Installing rljax (${REPO} @ ${BRANCH}) on all workers of ${TPU_NAME}"
tpu_ssh "bash -c $(printf '%q' "${remote}")" all
