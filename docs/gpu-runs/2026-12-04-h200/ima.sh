#!/bin/bash
# The illegal memory access: three variants of a 2-layer Qwen3-8B-shaped step, each in a process of its own.
export PYTHONUNBUFFERED=1 CUDA_LAUNCH_BLOCKING=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
for v in novjp default eager; do
  timeout 150 python3 docs/gpu-runs/2026-12-04-h200/ima_probe.py $v > $OUT/ima-$v.txt 2>&1
  echo "$v rc $?" >> $OUT/ima-rc.txt
done
grep -h "ok\|FAILED\|rc" $OUT/ima-*.txt
