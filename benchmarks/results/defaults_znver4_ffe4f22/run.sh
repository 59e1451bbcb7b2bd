#!/bin/bash
# resnet18 / mobilenet_v2, fp32 and int8, on the defaults, 8 trials/task, records library on (the default)
cd /work/main
for m in resnet18 mobilenet_v2; do
  for q in "" "--quantize"; do
    tag=$m${q:+-int8}
    t0=$(date +%s)
    .venv/bin/vta-pipeline run --source torchvision --model $m --trials-per-task 8 $q --store /work/bench-defaults/store-$tag > /work/bench-defaults/$tag.log 2>&1
    echo "$tag rc=$? $(( $(date +%s) - t0 )) s" >> /work/bench-defaults/summary.txt
  done
done
