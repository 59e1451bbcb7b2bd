#!/bin/bash
# usage: pass.sh OUTDIR [row ...]; each row on a fresh store under OUTDIR, 8 trials/task, defaults
out=$1; shift
cd /work/main
for tag in "$@"; do
  m=${tag%-int8}; q=""; [ "$tag" != "$m" ] && q="--quantize"
  t0=$(date +%s)
  .venv/bin/vta-pipeline run --source torchvision --model $m --trials-per-task 8 $q --store $out/store-$tag > $out/$tag.log 2>&1
  echo "$tag rc=$? $(( $(date +%s) - t0 )) s $(git rev-parse --short HEAD)" >> $out/summary.txt
done
