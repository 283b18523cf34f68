#!/bin/bash
# One device command: the headline parts on the Qwen3-8B shape (bf16, BP only): peak memory at
# 4 lengths and the longest length that fits, for streamfx and HF checkpointing (eager).
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; L=$OUT/log.txt; T0=$SECONDS
{ date; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -m pip install --no-deps --no-build-isolation -e . 2>&1 | tail -1
  python3 -c "import streamfx, torch, transformers, triton; print(streamfx.__file__, torch.__version__, transformers.__version__, triton.__version__, torch.cuda.is_available(), torch.backends.cudnn.version())"
} > $L 2>&1
timeout 545 python3 -m streamfx.bench gpu --parts memory,max_len --methods streamfx,ckpt --deadline 530 \
  --budget memory=330 --budget max_len=190 --out $R/ml >> $L 2>&1
echo "== rc $? at $((SECONDS-T0)) s" >> $L
for f in gpu.md gpu.json plan.json gpu.png; do cp $R/ml/$f $OUT/ 2>/dev/null; done
echo "== done at $((SECONDS-T0)) s" >> $L
