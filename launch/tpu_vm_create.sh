#!/usr/bin/env bash
# Create the Cloud TPU VM (or pod slice) an experiment names.
#
#   bash launch/tpu_vm_create.sh --config launch/experiments/t5_base_v4_32.env [--dry-run]
#
# Reads PROJECT, ZONE, TPU_NAME, ACCELERATOR_TYPE (v4-32, v5litepod-16, ...), RUNTIME_VERSION,
# and optionally SPOT=true (spot capacity; preempted runs resume with tpu_vm_run.sh --restart)
# and QUEUED=true (a queued resource that waits for capacity instead of failing). A queued
# resource is polled until it is ACTIVE, so tpu_vm_setup.sh can follow at once: one line per
# poll, every QUEUED_POLL_S seconds (default 60), for at most QUEUED_TIMEOUT_S (default 21600,
# 6 hours); it fails on FAILED, SUSPENDING, SUSPENDED or DELETING, or when the time is up.
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/_common.sh
parse_args "$@"
require_config PROJECT ZONE TPU_NAME ACCELERATOR_TYPE RUNTIME_VERSION
set_gcloud_flags

# Poll the queued resource until ACTIVE (success), a state it will not leave for ACTIVE, or
# QUEUED_TIMEOUT_S. A describe that fails (a network blip) counts as an unknown state and polls on.
wait_until_active() {
  local timeout="${QUEUED_TIMEOUT_S:-21600}" poll="${QUEUED_POLL_S:-60}" start=$SECONDS state
  local help="see: gcloud compute tpus queued-resources describe $TPU_NAME ${GCLOUD_FLAGS[*]}"
  while true; do
    state="$(gcloud compute tpus queued-resources describe "$TPU_NAME" "${GCLOUD_FLAGS[@]}" \
      --format='value(state.state)' 2>/dev/null || echo UNKNOWN)"
    echo "queued resource $TPU_NAME: ${state:-UNKNOWN} after $((SECONDS - start)) s"
    case "$state" in
      ACTIVE) return 0 ;;
      FAILED|SUSPENDING|SUSPENDED|DELETING)
        echo "Queued resource $TPU_NAME is $state and will not become ACTIVE ($help);" \
          "delete it with launch/tpu_vm_delete.sh and create it again." >&2
        return 1 ;;
    esac
    if [ $((SECONDS - start)) -ge "$timeout" ]; then
      echo "Queued resource $TPU_NAME is still ${state:-UNKNOWN} after ${timeout} s" \
        "(QUEUED_TIMEOUT_S). It stays in the queue: once it is ACTIVE ($help)," \
        "run launch/tpu_vm_setup.sh; or give up with launch/tpu_vm_delete.sh." >&2
      return 1
    fi
    sleep "$poll"
  done
}

spot=()
if [ "${SPOT:-false}" = true ]; then spot=(--spot); fi
if [ "${QUEUED:-false}" = true ]; then
  run gcloud compute tpus queued-resources create "$TPU_NAME" --node-id="$TPU_NAME" \
    "${GCLOUD_FLAGS[@]}" --accelerator-type="$ACCELERATOR_TYPE" \
    --runtime-version="$RUNTIME_VERSION" "${spot[@]}"
  if [ "$DRY_RUN" = false ]; then wait_until_active; fi
else
  run gcloud compute tpus tpu-vm create "$TPU_NAME" "${GCLOUD_FLAGS[@]}" \
    --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" "${spot[@]}"
fi
