#!/bin/bash
# third GPU run: the families never run on a GPU (variants, decode, generation, packed, the
# paths' contracts), the sweep points never reached (SDPA backends, compiled names, Triton,
# Pallas, Keras), and the main job as a whole on a small preset.
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MHA_SUITE_CACHE_DIR=/tmp/mhacache
OUT=${OUT:-/tmp/out}; PY=${PY:-python3}; CLI="$PY -m suite.cli"; DEV=${DEV:-cuda}; W=${W:-12}
T_A=${T_A:-160}; T_B=${T_B:-90}; T_C=${T_C:-100}; T_D=${T_D:-60}
K="variants/ or decode/ or generation/ or packed/ or contracts/"; DT="--dtype float32 --dtype float16 --dtype bfloat16"
PARTS=${PARTS:-A B C D}; on() { [[ " $PARTS " == *" $1 "* ]]; }
mkdir -p $OUT; LOG=$OUT/log3${SUFFIX:-}.txt
{
date -u; SECONDS=0
if [ "$DEV" = cuda ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  $PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
  nvidia-smi -L; lscpu | grep 'Model name'
fi
$PY -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
$PY -m pip list 2>/dev/null | grep -i -E '^(torch|jax|jaxlib|triton|flax|keras|transformers|numpy) '
echo "== list: describes the built-ins once, before the workers read them ($SECONDS s)"
timeout 150 $CLI list 2>&1 | tail -3
echo "== A: the new families, every case, on the implementations that do not compile per shape ($SECONDS s)"
on A && timeout -s INT $T_A $CLI check --device $DEV --isa native --workers $W --timeout 60 --no-progress -k "$K" $DT \
  --impl torch.eager --impl 'torch.sdpa*' --impl 'jax.*' --impl 'pallas.*' --impl 'triton.*' \
  --impl 'hf.model.*[[]eager]' --impl 'hf.model.*[[]sdpa]' --impl 'hf.llama*' --impl 'hf.gpt2*' --impl 'hf.bert*' \
  ${A_MORE---impl 'keras.*' --impl 'flax.*' --impl 'torch.nn*' --impl 'torch.F_mha*'} \
  --json $OUT/check3-paths.json 2>&1 | tail -40
echo "== B: the new families, the main job's sample, on the per-shape compilers ($SECONDS s)"
on B && timeout -s INT $T_B $CLI check --device $DEV --isa native --sample --workers $W --timeout 60 --no-progress -k "$K" $DT \
  --impl torch.flex --impl 'torch.compile*' --impl 'hf.model.*[[]flex]' \
  --json $OUT/check3-compiled.json 2>&1 | tail -30
echo "== C: sweep points never reached ($SECONDS s)"
on C && timeout -s INT $T_C $CLI sweep --preset gpu --device $DEV --lengths ${LENS:-1024,4096} --heads 16 --head-dim 64 \
  --dtype bfloat16 --mask none,causal --max-time 0.1 --timeout 60 --no-progress --out $OUT --name sweep3 \
  --impl 'torch.sdpa[[]*' --impl torch.flex --impl 'torch.compile*' --impl 'triton.*' --impl 'pallas.*' \
  --impl 'keras.*' 2>&1 | tail -40
echo "== D: the main job as a whole, preset ci, two implementations ($SECONDS s)"
on D && timeout -s INT $T_D $CLI run --preset ci --device $DEV --isa native --impl torch.sdpa --impl jax.jit \
  --out /tmp/run3 2>&1 | tail -30
on D && rm -f /tmp/run3/*.lock && (cd /tmp && tar czf $OUT/run3-main-job.tgz run3 2>/dev/null)
echo "== E: FlexAttention's variants, every case, half precision ($SECONDS s)"
on E && timeout -s INT ${T_E:-60} $CLI check --device $DEV --isa native --workers $W --timeout 60 --no-progress -k "variants/" \
  --dtype bfloat16 --dtype float16 --impl torch.flex --json $OUT/check3-flex-variants.json 2>&1 | tail -30
echo "== done $SECONDS s"; rm -f $OUT/*.lock; gzip -f $OUT/*.json; ls -la $OUT
} > $LOG 2>&1
tail -c 11000 $LOG
