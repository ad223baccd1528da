#!/bin/bash
# fourth GPU run: what came after run 3 and has never run on a GPU: the Pallas decode
# reproducer, why describing the built-ins takes minutes there, the dropout and paged families
# and generation/agrees_with_prefill, jax.nn's sequence lengths, FlexAttention's CUDA decoding
# kernel, and the sweep past 4,096 tokens for the backend variants and kernels.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MHA_SUITE_CACHE_DIR=/tmp/mhacache
OUT=${OUT:-/tmp/out}; PY=${PY:-python3}; CLI="$PY -m suite.cli"; DEV=${DEV:-cuda}; W=${W:-12}
T_R=${T_R:-70}; T_L=${T_L:-170}; T_A=${T_A:-110}; T_B=${T_B:-110}; T_C=${T_C:-80}
DT="--dtype float32 --dtype float16 --dtype bfloat16"
PARTS=${PARTS:-R L A B C}; on() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p $OUT; LOG=$OUT/log4${SUFFIX:-}.txt
{
date -u; SECONDS=0
if [ "$DEV" = cuda ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  $PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
  nvidia-smi -L; lscpu | grep 'Model name'
fi
$PY -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
$PY -m pip list 2>/dev/null | grep -i -E '^(torch|jax|jaxlib|triton|flax|keras|transformers|numpy) '
echo "== R: the Pallas GPU decode reproducer ($SECONDS s)"
on R && (cd docs/repro/pallas-gpu-decode-cuda && timeout $T_R $PY repro.py 2>&1 | grep -v Warning | tail -20)
echo "== L: describing the built-ins, profiled ($SECONDS s)"
on L && timeout -s INT $T_L $PY -m cProfile -o $OUT/list4.prof -m suite.cli list 2>&1 | tail -3
on L && $PY -c "
import pstats; s = pstats.Stats('$OUT/list4.prof'); s.sort_stats('cumulative')
s.print_stats(r'(suite|implementations)/', 30)" 2>&1 | grep -E '^ +[0-9]' | cut -c1-160 | head -32
echo "== A: dropout, paged, agrees_with_prefill and the inference forms, every case ($SECONDS s)"
on A && timeout -s INT $T_A $CLI check --device $DEV --isa native --workers $W --timeout 60 --no-progress $DT \
  -k "dropout/ or paged/ or agrees_with_prefill or decode/ or generation/ or packed/" \
  --impl torch.eager --impl 'torch.sdpa*' --impl 'torch.nn*' --impl 'torch.F_mha*' --impl 'jax.*' \
  --impl 'pallas.gpu.*' --impl 'hf.model.*[[]eager]' --impl 'hf.model.*[[]sdpa]' \
  --json $OUT/check4-paths.json 2>&1 | tail -45
echo "== B: FlexAttention and the compiled names on the inference forms and dropout ($SECONDS s)"
on B && timeout -s INT $T_B $CLI check --device $DEV --isa native --workers $W --timeout 90 --no-progress \
  --dtype float32 --dtype bfloat16 -k "decode/ or generation/ or paged/ or packed/ or dropout/" \
  --impl torch.flex --impl torch.compile --json $OUT/check4-flex.json 2>&1 | tail -30
echo "== C: the sweep past 4,096 tokens ($SECONDS s)"
on C && timeout -s INT $T_C $CLI sweep --preset gpu --device $DEV --lengths ${LENS:-8192,16384} --heads 16 \
  --head-dim 64 --dtype bfloat16 --mask none,causal --max-time 0.1 --timeout 40 --no-progress --out $OUT \
  --name sweep4 --impl 'torch.sdpa*' --impl torch.flex --impl 'torch.compile*' --impl 'triton.*' \
  --impl 'pallas.gpu.flash' 2>&1 | tail -40
echo "== done $SECONDS s"; rm -f $OUT/*.lock; gzip -f $OUT/*.json; ls -la $OUT
} > $LOG 2>&1
tail -c 11500 $LOG
