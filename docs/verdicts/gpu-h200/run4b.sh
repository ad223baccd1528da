#!/bin/bash
# run 4, second call: the reproducers that isolate run 4's GPU failures (Pallas paged and
# decode kernels, jax.nn in float16 with lengths), FlexAttention's CUDA decoding at head widths
# it takes, jax.nn's float16 decode case through the suite with its traceback, and the rest of
# the sweep past 4,096 tokens. matplotlib's font cache and inductor's CPU check are built in
# the background first (run 4's profile: most of describing the built-ins on a fresh machine).
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MHA_SUITE_CACHE_DIR=/tmp/mhacache
OUT=${OUT:-/tmp/out}; PY=${PY:-python3}; CLI="$PY -m suite.cli"; DEV=${DEV:-cuda}
mkdir -p $OUT; LOG=$OUT/log4b.txt
{
date -u; SECONDS=0
if [ "$DEV" = cuda ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  $PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
fi
($PY -c "import matplotlib.font_manager" >/dev/null 2>&1; echo "(font cache built at $SECONDS s)") &
($PY -c "from torch._inductor import cpu_vec_isa as c; c.pick_vec_isa()" >/dev/null 2>&1) &
echo "== R1: Pallas GPU paged reproducer ($SECONDS s)"
timeout 60 $PY docs/repro/pallas-gpu-paged-cuda/repro.py 2>&1 | grep -v -i warn | tail -20
echo "== R2: jax.nn float16 reproducer ($SECONDS s)"
timeout 50 $PY docs/repro/jax-nn-float16-lengths-cuda/repro.py 2>&1 | grep -v -i warn | tail -30
echo "== F: FlexAttention decoding on CUDA at head widths 16 and 64 ($SECONDS s)"
timeout 70 $PY docs/verdicts/gpu-h200/run4b_flex_decode.py 2>&1 | grep -E '^(torch|float|bfloat)' | tail -14
wait
echo "== L: describing the built-ins ($SECONDS s)"
timeout 150 $CLI list 2>&1 | tail -2
echo "== J: jax.nn float16 decode/one_row through the suite, its traceback ($SECONDS s)"
timeout 60 $CLI check --device $DEV --impl jax.nn --dtype float16 -k "decode/one_row" --no-progress \
  --json $OUT/check4b-jaxnn.json -- --tb=long 2>&1 | grep -E 'Error|error|jax_nn.py|functions.py|attention' | head -25
echo "== C: the rest of the sweep past 4,096 tokens ($SECONDS s)"
timeout -s INT ${T_C:-100} $CLI sweep --preset gpu --device $DEV --lengths 8192,16384 --heads 16 \
  --head-dim 64 --dtype bfloat16 --mask none,causal --max-time 0.1 --timeout 40 --no-progress --out $OUT \
  --name sweep4b --impl torch.flex --impl 'torch.compile*' --impl 'triton.*' \
  --impl 'pallas.gpu.flash' 2>&1 | grep -v -E '^W1|noisy' | tail -24
echo "== done $SECONDS s"; rm -f $OUT/*.lock; gzip -f $OUT/*.json; ls -la $OUT
} > $LOG 2>&1
tail -c 11500 $LOG
