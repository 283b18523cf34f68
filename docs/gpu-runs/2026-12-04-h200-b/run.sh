#!/bin/bash
# The three probe variants side by side (each in a process of its own, CUDA_LAUNCH_BLOCKING=1).
export PYTHONUNBUFFERED=1 CUDA_LAUNCH_BLOCKING=1
D=docs/gpu-runs/2026-12-04-h200-b
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
for v in default chunks-eager outer-eager; do
  (timeout ${LIMIT:-430} python3 $D/probe.py $v 4096 2 > $OUT/$v.txt 2>&1; echo "$v rc $?" >> $OUT/rc.txt) &
done
wait
cat $OUT/rc.txt; grep -h "ok\|FAILED\|graphs\|Error" $OUT/*.txt | head -40
