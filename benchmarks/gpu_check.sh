#!/usr/bin/env bash
# One device check for a lent NVIDIA GPU (written for an H200), under 8 minutes: the issue's
# accelerator targets measured in one call, a table printed and JSON written.
#
#   bash benchmarks/gpu_check.sh [OUT_DIR]        (default: $OUT, else benchmarks/results/gpu)
#
# Measures, each the trainer's own jitted step with Adafactor, bfloat16 activations and float32
# parameters, cuDNN fused attention (`attention_implementation='dot_product_attention'`):
#   t5_base      T5.1.1-base (gin_configs/models/t5_1_1/base.gin), batch 64 x (512 + 114),
#                target >= 45 % MFU
#   t5_base_xla  the same with the reference (XLA) attention, to show what the fused kernel buys
#   t5_base_flash the same with this repository's Pallas kernel, T5's bias computed in-kernel
#                (`attention_implementation='flash'`, t5x_like/models/flash_attention.py)
#   lm_1b        a ~1B decoder-only model (18 pre-LN layers, width 2048, 16 heads, feed-forward
#                8192, vocabulary 32128), batch 8 x 2048, target >= 55 % MFU
#   decode       T5 decoding throughput (greedy and beam 4, batch 1 and 32)
# MFU is against the measured bfloat16 matmul rate of the chip (`t5x_like.hardware`).
# Needs a jax with CUDA in the Python it finds (.venv/bin/python first): nothing is installed
# here, because a lent device machine may have no network.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-benchmarks/results/gpu}}"
mkdir -p "$OUT_DIR"
PY=python
[ -x .venv/bin/python ] && PY=.venv/bin/python
if ! "$PY" -c 'import jax, sys; sys.exit(jax.devices()[0].platform != "gpu")' 2>/dev/null; then
  echo "error: $PY has no jax GPU backend (install jax[cuda12] at the locked version:" \
       "bash launch/gpu_run.sh does it); nothing measured." >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"
BF16=(--dtype bfloat16 --steps 10)
FUSED="'dot_product_attention'"

step() {  # name, args...: one benchmark, its log beside its JSON; a failure does not stop the rest
  local name=$1; shift
  echo "== $name"
  timeout 150 "$PY" -m benchmarks.train_throughput "$@" --out "$OUT_DIR/$name.json" \
    > "$OUT_DIR/$name.log" 2>&1 || echo "   $name failed (see $OUT_DIR/$name.log)"
  grep -E "compile time|median step|tokens/s|MFU|XLA step memory" "$OUT_DIR/$name.log" | sed 's/^/   /'
}

step t5_base --gin_file gin_configs/models/t5_1_1/base.gin "${BF16[@]}" --batch 64 \
  --inputs 512 --targets 114 --gin T5Config.dropout_rate=0.0 \
  --gin "T5Config.attention_implementation=$FUSED"
step t5_base_xla --gin_file gin_configs/models/t5_1_1/base.gin "${BF16[@]}" --batch 64 \
  --inputs 512 --targets 114 --gin T5Config.dropout_rate=0.0
step t5_base_flash --gin_file gin_configs/models/t5_1_1/base.gin "${BF16[@]}" --batch 64 \
  --inputs 512 --targets 114 --gin T5Config.dropout_rate=0.0 \
  --gin "T5Config.attention_implementation='flash'" --steps 5
step lm_1b --family decoder_only "${BF16[@]}" --batch 8 --inputs 0 --targets 2048 \
  --gin GPTConfig.vocab_size=32128 --gin GPTConfig.max_position_embeddings=2048 \
  --gin GPTConfig.hidden_size=2048 --gin GPTConfig.num_layers=18 --gin GPTConfig.num_heads=16 \
  --gin GPTConfig.intermediate_size=8192 --gin GPTConfig.pre_layer_norm=True \
  --gin "GPTConfig.activation='gelu'" --gin GPTConfig.dropout_rate=0.0 \
  --gin GPTConfig.attention_dropout_rate=0.0 --gin "GPTConfig.attention_implementation=$FUSED"
echo "== decode"
timeout 120 "$PY" -m benchmarks.decode_throughput --repeats 3 --out "$OUT_DIR/decode.json" \
  > "$OUT_DIR/decode.log" 2>&1 || echo "   decode failed (see $OUT_DIR/decode.log)"
sed 's/^/   /' "$OUT_DIR/decode.log" | grep -E "greedy|beam" || true

"$PY" -m benchmarks.gpu_summary "$OUT_DIR"
