#!/usr/bin/env bash
# Quickstart: creates .venv if missing, installs t5x_like (locked versions), then pretrains a
# small T5 with span corruption on the offline corpus (English prose shipped with Python) on
# CPU, in a few minutes. Extra arguments are passed to the trainer, e.g.
#   bash launch/quickstart.sh --gin.TRAIN_STEPS=2000 --gin.MODEL_DIR=/tmp/qs
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/_venv.sh
ensure_venv
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec python -m t5x_like.train --gin_file=gin_configs/runs/quickstart.gin "$@"
