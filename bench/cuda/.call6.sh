set -u
export OUT
. bench/cuda/device_env.sh
mkdir -p $OUT/fk
OUT=$OUT/fk PRESET="react:32:4:warm" POINTS="react-32k-w4-warm-forked" BUDGET=175 bash bench/cuda/forkkv_setting.sh > $OUT/forkkv_run.log 2>&1
tail -4 $OUT/forkkv_run.log; grep "sharing=forked" $OUT/fk/forkkv/*/report.md
cd $OUT && tar cJf /tmp/all.tar.xz . ; find . -mindepth 1 -delete; mv /tmp/all.tar.xz .
