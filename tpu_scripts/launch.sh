#!/usr/bin/env bash
# Launch one rljax experiment on every worker of a TPU VM (one process per host).
#
#   tpu_scripts/launch.sh --name rljax-v4 --zone us-central2-b \
#       --config experiments/grpo.py --run-dir gs://BUCKET/runs/grpo-v4 \
#       [--log runs/grpo-v4.log] [--detach] [--dry-run] [-- --config.run.iterations=200 ...]
#
# Runs `rljax train --config CONFIG --config.run.dir=RUN_DIR [overrides]` in ~/rljax on all
# workers. The CLI calls rljax.parallel.initialize_distributed, i.e. jax.distributed.initialize(),
# which on TPU VMs finds the coordinator, the process count and its index from TPU metadata.
# Checkpoints go to RUN_DIR (orbax writes gs:// paths collectively from all hosts).
# Default: stream every worker's output to this terminal and append it to --log.
# --detach: start the run under nohup on the workers (log in ~/rljax-run.log on each),
# then follow it with logs.sh; the run survives a dropped ssh connection.
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
source "$(dirname "$0")/common.sh"

CONFIG=""
RUN_DIR=""
LOG=""
DETACH=0
REMOTE_LOG="rljax-run.log"
OVERRIDES=()

while [[ $# -gt 0 ]]; do
  common_flag "$@"
  if (( SHIFT )); then shift "${SHIFT}"; continue; fi
  case "$1" in
    --config) CONFIG="$2"; shift 2 ;;
    --run-dir) RUN_DIR="$2"; shift 2 ;;
    --log) LOG="$2"; shift 2 ;;
    --detach) DETACH=1; shift ;;
    --) shift; OVERRIDES=("$@"); break ;;
    *) unknown_argument "$1" ;;
  esac
done
require --name "${TPU_NAME}"
require --zone "${TPU_ZONE}"
require --config "${CONFIG}"
require --run-dir "${RUN_DIR}"
[[ "${RUN_DIR}" == gs://* ]] || echo "warning: --run-dir ${RUN_DIR} is not a gs:// path;" \
  "each host would write its own local copy" >&2
LOG="${LOG:-runs/$(basename "${RUN_DIR}").log}"

train=(python3 -m rljax train --config "${CONFIG}" "--config.run.dir=${RUN_DIR}"
       "${OVERRIDES[@]}")
train_cmd="$(printf '%q ' "${train[@]}")"

if [[ "${DETACH}" == "1" ]]; then
  remote="cd ~/rljax && nohup ${train_cmd} > ~/${REMOTE_LOG} 2>&1 < /dev/null &"
  echo "Starting ${CONFIG} detached on all workers of ${TPU_NAME}; run dir ${RUN_DIR}"
  tpu_ssh "${remote}" all
  echo "Follow it with: tpu_scripts/logs.sh --name ${TPU_NAME} --zone ${TPU_ZONE}"
  exit 0
fi

mkdir -p "$(dirname "${LOG}")"
echo "Running ${CONFIG} on all workers of ${TPU_NAME}; run dir ${RUN_DIR}; log ${LOG}"
remote="cd ~/rljax && ${train_cmd} 2>&1"
if [[ "${DRY_RUN}" == "1" ]]; then
  tpu_ssh "${remote}" all
else
  tpu_ssh "${remote}" all 2>&1 | tee -a "${LOG}"
fi
