#!/bin/bash
# One device command: CUDA kernel forms and offload rows, then where a step's time goes
# (Qwen3-8B shape cut to 4 layers, bf16) for streamfx and for checkpointing, in separate processes.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; L=$OUT/log.txt; T0=$SECONDS
{ date; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -m pip install --no-deps --no-build-isolation -e . 2>&1 | tail -1
  python3 -c "import streamfx, torch, transformers, triton; print(streamfx.__file__, torch.__version__, transformers.__version__, triton.__version__, torch.cuda.is_available(), torch.backends.cudnn.version())"
} > $L 2>&1
step() { local name=$1 secs=$2; shift 2; echo "== $name: $*" >> $L
  timeout $secs "$@" >> $L 2>&1; echo "== $name rc $? at $((SECONDS-T0)) s" >> $L; }
step ko 215 python3 -m streamfx.bench gpu --parts kernels,offload --budget kernels=130 --budget offload=75 --deadline 210 --out $R/ko
cp $R/ko/gpu.md $OUT/ko.md 2>/dev/null
step ps 160 python3 -m streamfx.bench.gpu_profile --methods streamfx --seqs 4096,16384 --out $R/ps
cp $R/ps/profile.md $OUT/ps.md 2>/dev/null
step pc 130 python3 -m streamfx.bench.gpu_profile --methods ckpt,ckpt+compile --seqs 4096,16384 --out $R/pc
cp $R/pc/profile.md $OUT/pc.md 2>/dev/null
tar czf $OUT/r.tgz -C /tmp r 2>> $L
echo "== done at $((SECONDS-T0)) s" >> $L
