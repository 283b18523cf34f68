#!/bin/bash
# Two processes side by side: lengths 4096, 4096, 8192 and lengths 16384, 2048.
export PYTHONUNBUFFERED=1
D=docs/gpu-runs/2026-12-04-h200-c
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
(timeout ${LIMIT:-420} python3 $D/probe.py 4096,4096,8192 > $OUT/a.txt 2>&1; echo "a rc $?" >> $OUT/rc.txt) &
(timeout ${LIMIT:-420} python3 $D/probe.py 16384,2048 > $OUT/b.txt 2>&1; echo "b rc $?" >> $OUT/rc.txt) &
wait
cat $OUT/rc.txt; grep -h "^T \|   \|FAILED\|Error" $OUT/a.txt $OUT/b.txt | head -60
