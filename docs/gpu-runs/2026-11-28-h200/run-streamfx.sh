#!/bin/bash
# The second command (after run.sh's streamfx profile was cut by its 160 s): streamfx's profile alone.
export PYTHONUNBUFFERED=1; python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
S=$SECONDS; timeout 265 python3 -m streamfx.bench.gpu_profile --methods streamfx --seqs 4096 --out $OUT/ps > $OUT/log.txt 2>&1
echo "rc $? at $((SECONDS-S)) s" >> $OUT/log.txt
