#!/bin/bash
# The next device command: the probe (2 layers, lengths 4096,4096,8192 and 16384,2048, each step
# against fp32 eager, with every compile's shape guards) beside the headline's memory part
# (36 layers, streamfx and checkpointing at 4 lengths), then max_len in the time left.
export PYTHONUNBUFFERED=1
D=docs/gpu-runs/2026-12-04-h200-c; R=/tmp/r; mkdir -p $R; T0=$SECONDS
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
(timeout 300 python3 $D/probe.py 4096,4096,8192 > $OUT/a.txt 2>&1; echo "a rc $?" >> $OUT/rc.txt) &
(timeout 300 python3 $D/probe.py 16384,2048 > $OUT/b.txt 2>&1; echo "b rc $?" >> $OUT/rc.txt) &
timeout 420 python3 -m streamfx.bench gpu --parts memory --methods streamfx,ckpt --deadline 410 \
  --budget memory=400 --out $R/m > $OUT/memory.txt 2>&1
echo "memory rc $? at $((SECONDS-T0)) s" >> $OUT/rc.txt
wait
left=$((560 - (SECONDS-T0)))
[ $left -gt 90 ] && timeout $left python3 -m streamfx.bench gpu --parts max_len --methods streamfx,ckpt \
  --deadline $((left-10)) --budget max_len=$((left-15)) --out $R/x > $OUT/max_len.txt 2>&1
echo "max_len rc $? at $((SECONDS-T0)) s" >> $OUT/rc.txt
cp $R/m/gpu.md $OUT/memory.md 2>/dev/null; cp $R/x/gpu.md $OUT/max_len.md 2>/dev/null
cat $OUT/rc.txt; grep -h "^T \|   \|FAILED\|Error" $OUT/a.txt $OUT/b.txt | head -40
