#!/usr/bin/env bash
# Run the experiment on GPU hosts: one process per host driving all its local GPUs.
#
#   bash launch/gpu_run.sh --config launch/experiments/NAME.env [--dry-run] [-- extra args]
#
# One host: just runs the trainer. Several hosts: either inside a SLURM allocation with more
# than one task (srun starts one process per task; jax.distributed reads SLURM's variables),
# or by hand on every host with COORDINATOR=host0:1234 NUM_PROCESSES=N PROCESS_ID=i in the
# environment (the trainer's T5X_LIKE_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID).
# Installs jax's CUDA build into .venv first (GPU=false skips that, e.g. on a CPU box).
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/_common.sh
source launch/_venv.sh
parse_args "$@"
require_config GIN_FILES MODEL_DIR
build_train_command
if [ "$DRY_RUN" = false ]; then
  ensure_venv
  if [ "${GPU:-true}" = true ]; then install_accelerator gpu; fi
fi
if [ -n "${COORDINATOR:-}" ]; then
  : "${NUM_PROCESSES:?set NUM_PROCESSES with COORDINATOR}" "${PROCESS_ID:?set PROCESS_ID}"
  run env T5X_LIKE_COORDINATOR="$COORDINATOR" T5X_LIKE_NUM_PROCESSES="$NUM_PROCESSES" \
    T5X_LIKE_PROCESS_ID="$PROCESS_ID" "${TRAIN_CMD[@]}"
elif [ "${SLURM_NTASKS:-1}" -gt 1 ]; then
  run srun --ntasks="$SLURM_NTASKS" --ntasks-per-node="${SLURM_NTASKS_PER_NODE:-1}" \
    "${TRAIN_CMD[@]}"
else
  run "${TRAIN_CMD[@]}"
fi
