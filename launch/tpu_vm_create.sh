#!/usr/bin/env bash
# Create the Cloud TPU VM (or pod slice) an experiment names.
#
#   bash launch/tpu_vm_create.sh --config launch/experiments/t5_base_v4_32.env [--dry-run]
#
# Reads PROJECT, ZONE, TPU_NAME, ACCELERATOR_TYPE (v4-32, v5litepod-16, ...), RUNTIME_VERSION,
# and optionally SPOT=true (spot capacity; preempted runs resume with tpu_vm_run.sh --restart)
# and QUEUED=true (a queued resource that waits for capacity instead of failing).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/_common.sh
parse_args "$@"
require_config PROJECT ZONE TPU_NAME ACCELERATOR_TYPE RUNTIME_VERSION
set_gcloud_flags
spot=()
if [ "${SPOT:-false}" = true ]; then spot=(--spot); fi
if [ "${QUEUED:-false}" = true ]; then
  run gcloud compute tpus queued-resources create "$TPU_NAME" --node-id="$TPU_NAME" \
    "${GCLOUD_FLAGS[@]}" --accelerator-type="$ACCELERATOR_TYPE" \
    --runtime-version="$RUNTIME_VERSION" "${spot[@]}"
else
  run gcloud compute tpus tpu-vm create "$TPU_NAME" "${GCLOUD_FLAGS[@]}" \
    --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" "${spot[@]}"
fi
