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

usage() {
  sed -n '2,9p' "$0"
  exit "${1:-0}"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) TPU_NAME="$2"; shift 2 ;;
    --zone) TPU_ZONE="$2"; shift 2 ;;
    --project) GCP_PROJECT="$2"; shift 2 ;;
    --repo) REPO="$2"; shift 2 ;;
    --branch) BRANCH="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "unknown argument: $1" >&2; usage 2 ;;
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
