#!/usr/bin/env bash
# Run the experiment's gin files on all workers of the TPU VM at once (one process per host;
# jax.distributed finds the others from the TPU metadata), detached with nohup: each worker
# writes ~/REMOTE_DIR/logs/RUN_NAME.log and the run survives this terminal.
#
#   bash launch/tpu_vm_run.sh --config launch/experiments/t5_base_v4_32.env [--dry-run] \
#       [--restart] [-- --gin.TRAIN_STEPS=1000 ...]
#
# MODEL_DIR should be on GCS (gs://...): every host reads and writes the same checkpoints.
# --restart (for SPOT=true): stay attached and, whenever the slice is preempted, delete it,
# create it again, set it up and rerun; the run resumes from its last checkpoint (a SIGTERM
# before preemption saves one at the current step). Stops when a run exits 0.
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/_common.sh
restart=false
args=()
for arg in "$@"; do
  if [ "$arg" = --restart ]; then restart=true; else args+=("$arg"); fi
done
parse_args "${args[@]}"
require_config PROJECT ZONE TPU_NAME GIN_FILES MODEL_DIR
set_gcloud_flags
build_train_command
remote_dir="${REMOTE_DIR:-t5x_like}"
log="logs/${RUN_NAME:-run}.log"
train="$(quoted "${TRAIN_CMD[@]}")"
if [ "$restart" = false ]; then
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --worker=all \
    --command="cd ~/${remote_dir} && mkdir -p logs && source .venv/bin/activate && nohup ${train} > ${log} 2>&1 &"
  exit 0
fi
config_args=(--config "$CONFIG")
if [ "$DRY_RUN" = true ]; then config_args+=(--dry-run); fi
while true; do
  if run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --worker=all \
    --command="cd ~/${remote_dir} && mkdir -p logs && source .venv/bin/activate && ${train} 2>&1 | tee -a ${log}"; then
    break
  fi
  state="$(gcloud compute tpus tpu-vm describe "$TPU_NAME" "${GCLOUD_FLAGS[@]}" \
    --format='value(state)' 2>/dev/null || echo MISSING)"
  echo "run ended with an error; the TPU VM is ${state}" >&2
  if [ "$state" = PREEMPTED ] || [ "$state" = MISSING ]; then
    if [ "$state" = PREEMPTED ]; then
      bash launch/tpu_vm_delete.sh "${config_args[@]}"
    fi
    bash launch/tpu_vm_create.sh "${config_args[@]}"
    bash launch/tpu_vm_setup.sh "${config_args[@]}"
  fi
  sleep 60
done
