#!/usr/bin/env bash
# Shared helpers for the tpu_scripts (sourced, not run). Defaults come from the
# environment so a shell can export them once:
#   TPU_NAME, TPU_ZONE, TPU_TYPE (accelerator type), TPU_VERSION (runtime version),
#   GCP_PROJECT (optional; gcloud's configured project otherwise).

DRY_RUN="${DRY_RUN:-0}"
TPU_NAME="${TPU_NAME:-}"
TPU_ZONE="${TPU_ZONE:-}"
GCP_PROJECT="${GCP_PROJECT:-}"

# Prints the script's header comment (its usage) and exits with status $1.
usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit "${1:-0}"
}

# Handles a flag every script takes (--name --zone --project --dry-run --help); sets SHIFT
# to the number of arguments it used, 0 when the flag is the script's own.
common_flag() {
  SHIFT=0
  case "$1" in
    --name) TPU_NAME="${2:-}"; SHIFT=2 ;;
    --zone) TPU_ZONE="${2:-}"; SHIFT=2 ;;
    --project) GCP_PROJECT="${2:-}"; SHIFT=2 ;;
    --dry-run) DRY_RUN=1; SHIFT=1 ;;
    -h|--help) usage 0 ;;
  esac
  if (( SHIFT > $# )); then
    die "$1 needs a value"
  fi
}

unknown_argument() {
  echo "unknown argument: $1" >&2
  usage 2
}

die() {
  echo "error: $*" >&2
  exit 2
}

# Prints the command (shell-quoted, so it can be copied), then runs it unless DRY_RUN=1.
run() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
  if [[ "${DRY_RUN}" != "1" ]]; then
    "$@"
  fi
}

require() {
  local flag="$1" value="$2"
  [[ -n "${value}" ]] || die "${flag} is required (or set the matching environment variable)"
}

# --project flag for gcloud, empty when GCP_PROJECT is unset.
project_args() {
  if [[ -n "${GCP_PROJECT}" ]]; then
    printf '%s\n' "--project=${GCP_PROJECT}"
  fi
}

# ssh into every worker of the TPU VM (or one: WORKER=0) and run a command there.
tpu_ssh() {
  local command="$1" worker="${2:-all}"
  local extra=()
  mapfile -t extra < <(project_args)
  echo "# on worker(s) ${worker}: ${command}"
  run gcloud compute tpus tpu-vm ssh "${TPU_NAME}" --zone="${TPU_ZONE}" "${extra[@]}" \
    --worker="${worker}" --command="${command}"
}
