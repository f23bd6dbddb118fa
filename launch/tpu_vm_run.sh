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
# before preemption saves one at the current step). Stops when a run exits 0, or gives up
# (exit 1) after MAX_RESTARTS (default 20) reruns, RESTART_SLEEP_S (default 60) seconds apart;
# a failed delete / create / setup counts as one of them and the loop goes on. A run that fails
# on a slice that is still READY is rerun without recreating it.
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
max_restarts="${MAX_RESTARTS:-20}"
pause="${RESTART_SLEEP_S:-60}"

# The run on every worker, attached; succeeds when the trainer exits 0 on all of them
# (pipefail: the exit status is the trainer's, not tee's).
run_attached() {
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --worker=all \
    --command="set -o pipefail && cd ~/${remote_dir} && mkdir -p logs && source .venv/bin/activate && ${train} 2>&1 | tee -a ${log}"
}

# The TPU VM's state (READY, PREEMPTED, TERMINATED, ...), or MISSING when it cannot be described.
vm_state() {
  gcloud compute tpus tpu-vm describe "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --format='value(state)' \
    2>/dev/null || echo MISSING
}

# Delete what is left of the slice (a queued resource outlives its preempted node), create it
# again and set it up. Called as a condition, where set -e is off, so every step is checked here.
recreate_slice() {
  if [ "$1" != MISSING ] || [ "${QUEUED:-false}" = true ]; then
    bash launch/tpu_vm_delete.sh "${config_args[@]}" \
      || echo "Deleting $TPU_NAME failed (already gone?); creating it anyway." >&2
  fi
  bash launch/tpu_vm_create.sh "${config_args[@]}" \
    && bash launch/tpu_vm_setup.sh "${config_args[@]}"
}

# The run finished: the trainer exited 0 on every worker and the slice was not preempted
# under it (a trainer stopped by the preemption's SIGTERM saves, then also exits 0).
run_finished() {
  run_attached || return 1
  [ "$DRY_RUN" = true ] && return 0
  case "$(vm_state)" in
    PREEMPTED|TERMINATED|MISSING)
      echo "The trainer exited 0 but the TPU VM was preempted under it: resuming." >&2
      return 1 ;;
  esac
}

restarts=0
while ! run_finished; do
  state="$(vm_state)"
  echo "Run ended before its last step; the TPU VM is ${state}." >&2
  if [ "$restarts" -ge "$max_restarts" ]; then
    echo "Giving up after ${restarts} restart(s) (MAX_RESTARTS=${max_restarts}): see" \
      "${log} under ~/${remote_dir} on the workers; rerunning with --restart resumes from" \
      "the last checkpoint." >&2
    exit 1
  fi
  restarts=$((restarts + 1))
  echo "Restart ${restarts} of at most ${max_restarts}."
  case "$state" in
    PREEMPTED|TERMINATED|MISSING)
      recreate_slice "$state" || echo "Recreating $TPU_NAME failed; trying again." >&2 ;;
  esac
  sleep "$pause"
done
if [ "$DRY_RUN" = false ]; then
  echo "Run finished after ${restarts} restart(s) (MAX_RESTARTS=${max_restarts})."
fi
