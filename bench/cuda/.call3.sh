#!/bin/bash
set -u
. bench/cuda/device_env.sh
OUT=$OUT PRESET=peer BUDGET=540 bash bench/cuda/kvflow_setting.sh > $OUT/kvflow_peer.log 2>&1
tail -12 $OUT/kvflow_peer.log
cd $OUT && tar cJf /tmp/all.tar.xz . ; find . -mindepth 1 -delete; mv /tmp/all.tar.xz .
