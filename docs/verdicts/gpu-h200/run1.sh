#!/bin/bash
# the GPU half: conformance sample on cuda, a narrowed gpu sweep, the report
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MHA_SUITE_CACHE_DIR=/tmp/mhacache
DEV=${DEV:-cuda}; OUT=${OUT:-/tmp/out}; PY=${PY:-python3}; CLI="$PY -m suite.cli"
T_LIST=${T_LIST:-90}; T_K=${T_K:-150}; T_R=${T_R:-150}; T_S=${T_S:-150}
LOG=$OUT/log.txt; mkdir -p $OUT
{
date -u; SECONDS=0
if [ "$DEV" = cuda ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  $PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
  nvidia-smi -L; lscpu | grep 'Model name'
fi
$PY -c "import torch, jax; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name()); print('jax', jax.__version__, jax.devices())"
$PY -m pip list 2>/dev/null | grep -i -E '^(torch|jax|jaxlib|triton|flax|keras|transformers|numpy) '
echo "== list $SECONDS s"; timeout $T_LIST $CLI list 2>&1
echo "== check kernels $SECONDS s"
timeout -s INT $T_K $CLI check --device $DEV --isa native --sample --workers ${W:-6} --timeout 120 --no-progress \
  --impl 'torch.sdpa*' --impl 'triton.*' --impl 'pallas.*' --impl 'jax.*' --impl torch.flex --impl torch.eager \
  --json $OUT/check-kernels.json 2>&1 | tail -40
echo "== check rest $SECONDS s"
timeout -s INT $T_R $CLI check --device $DEV --isa native --sample --workers ${W:-6} --timeout 120 --no-progress \
  --impl 'torch.nn*' --impl 'torch.F_mha*' --impl 'torch.compile*' --impl 'flax.*' --impl 'hf.*' --impl numpy \
  --json $OUT/check-rest.json 2>&1 | tail -40
echo "== sweep $SECONDS s"
timeout -s INT $T_S $CLI sweep --preset ${PRESET:-gpu} --device $DEV --sample --lengths ${LENS:-1024,4096,16384} --heads 16 --head-dim 64 \
  --dtype bfloat16 --mask none,causal --max-time 0.2 --timeout 60 --no-progress --out $OUT --name sweep-gpu 2>&1 | tail -40
echo "== report $SECONDS s"
timeout 90 $CLI report $OUT --out $OUT/report.html 2>&1 | tail -10
echo "== done $SECONDS s"; rm -f $OUT/*.lock; ls -la $OUT
} > $LOG 2>&1
tail -c 11000 $LOG
