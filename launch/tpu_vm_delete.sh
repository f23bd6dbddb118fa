#!/usr/bin/env bash
# Delete the experiment's TPU VM (its queued resource too when QUEUED=true). Checkpoints and
# summaries on GCS stay.
#
#   bash launch/tpu_vm_delete.sh --config launch/experiments/t5_base_v4_32.env [--dry-run]
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/_common.sh
parse_args "$@"
require_config PROJECT ZONE TPU_NAME
set_gcloud_flags
if [ "${QUEUED:-false}" = true ]; then
  run gcloud compute tpus queued-resources delete "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --force \
    --quiet
else
  run gcloud compute tpus tpu-vm delete "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --quiet
fi
