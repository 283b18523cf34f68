#!/bin/bash
# The next device command: the probe (2 layers, lengths 4096,4096,8192 and 16384,2048, each step
# against fp32 eager, with every compile's shape guards) beside the headline's memory part
# (36 layers, streamfx and checkpointing at 4 lengths) and the longest-length search after it.
export PYTHONUNBUFFERED=1
D=docs/gpu-runs/2026-12-04-h200-c; R=/tmp/r; mkdir -p $R; T0=$SECONDS
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
(timeout 300 python3 $D/probe.py 4096,4096,8192 > $OUT/a.txt 2>&1; echo "a rc $?" >> $OUT/rc.txt) &
(timeout 300 python3 $D/probe.py 16384,2048 > $OUT/b.txt 2>&1; echo "b rc $?" >> $OUT/rc.txt) &
# (one command for both parts: the longest-length search bisects with the memory part's compiled
# steps and starts from its fit; a command of max_len alone has neither and skips every method)
timeout 545 python3 -m streamfx.bench gpu --parts memory,max_len --methods streamfx,ckpt --deadline 530 \
  --budget memory=380 --budget max_len=140 --out $R/m > $OUT/memory.txt 2>&1
echo "memory,max_len rc $? at $((SECONDS-T0)) s" >> $OUT/rc.txt
wait
cp $R/m/gpu.md $OUT/memory.md 2>/dev/null; cp $R/m/gpu.json $OUT/memory.json 2>/dev/null
cat $OUT/rc.txt; grep -h "^T \|   \|FAILED\|Error" $OUT/a.txt $OUT/b.txt | head -40
