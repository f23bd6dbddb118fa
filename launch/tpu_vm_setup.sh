#!/usr/bin/env bash
# Put this checkout on every worker of the TPU VM and install it there, with the README's
# install step (launch/_venv.sh: .venv at the locked versions) plus jax's TPU build.
# Stock runtime images (tpu-ubuntu2204-base) ship Python 3.10: where a worker has no Python
# >= 3.11, ensure_python installs uv (pip install --user uv) and uv installs 3.11; each worker
# prints one line saying which Python it used and whether it installed it. Reruns reuse it.
#
#   bash launch/tpu_vm_setup.sh --config launch/experiments/t5_base_v4_32.env [--dry-run]
#
# The code travels as an archive of the committed tree (git archive HEAD), so every worker
# runs exactly the same commit; commit first. REMOTE_DIR (default t5x_like) is where it lands
# in each worker's home directory.
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/_common.sh
parse_args "$@"
require_config PROJECT ZONE TPU_NAME
set_gcloud_flags
remote_dir="${REMOTE_DIR:-t5x_like}"
archive="/tmp/${TPU_NAME}_t5x_like.tar.gz"
run git archive --format=tar.gz -o "$archive" HEAD
run gcloud compute tpus tpu-vm scp "$archive" "${TPU_NAME}:~/t5x_like.tar.gz" \
  "${GCLOUD_FLAGS[@]}" --worker=all
install="mkdir -p ~/${remote_dir} && tar -xzf ~/t5x_like.tar.gz -C ~/${remote_dir} && cd ~/${remote_dir} && bash -c 'source launch/_venv.sh && ensure_python && ensure_venv && install_accelerator tpu'"
run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${GCLOUD_FLAGS[@]}" --worker=all \
  --command="$install"
