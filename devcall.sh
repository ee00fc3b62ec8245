#!/usr/bin/env bash
set -u
export NCCL_NVLS_ENABLE=0
tar -C .devrun -xzf .devrun/devrun.tgz
export LD_LIBRARY_PATH="$PWD/.devrun/lib"
for s in 1002; do
.devrun/tpcheck run --backend cuda --suite te --tp 2 --recipe fp8_cs --seed $s --filter 'LayerNormMLP.sp1.output_layer_init_method=constant$' --json /tmp/one.json > /dev/null 2>&1
python3 -c "
import json; r=json.load(open('/tmp/one.json'))
for t in r['cases'][0]['tensors']:
  if t['name'] in ('fc2_bias','output'): print(t['name'], t['verdicts']['truth']['reason']); print(json.dumps(t['statistics']['truth']))
"
done
