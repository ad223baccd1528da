#!/bin/bash
# second GPU run: the checks again after the rule and adapter fixes, and one probe
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false MHA_SUITE_CACHE_DIR=/tmp/mhacache
OUT=${OUT:-/tmp/out}; PY=${PY:-python3}; CLI="$PY -m suite.cli"; DEV=${DEV:-cuda}
mkdir -p $OUT; LOG=$OUT/log2.txt
{
date -u; SECONDS=0
if [ "$DEV" = cuda ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
  $PY -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
fi
$PY - <<'PYEOF'
import torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
dev = "cuda" if torch.cuda.is_available() else "cpu"
g = torch.Generator().manual_seed(0)
for dt in (torch.float16, torch.bfloat16):
    q = torch.randn(1, 2, 3, 64, generator=g).to(dev, dt); k = torch.randn(1, 2, 5, 64, generator=g).to(dev, dt)
    v = torch.randn(1, 2, 5, 64, generator=g).to(dev, dt)
    m = torch.zeros(1, 1, 3, 5, dtype=dt); m[..., 0, :] = torch.finfo(dt).min; m = m.to(dev)
    for b in ("MATH", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "CUDNN_ATTENTION"):
        try:
            with sdpa_kernel(getattr(SDPBackend, b)):
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
            print(dt, b, "row0 max|o - mean(v)|", (o[0, :, 0].float() - v[0].float().mean(1)).abs().max().item(), "row0 max|o|", o[0, :, 0].float().abs().max().item())
        except RuntimeError as e:
            print(dt, b, "refused", str(e)[:60])
        try:
            with sdpa_kernel(getattr(SDPBackend, b)):
                o = F.scaled_dot_product_attention(q, k, v, scale=-0.125)
            ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=-0.125)
            print(dt, b, "negative scale: nan", bool(o.isnan().any()), "err", (o.double() - ref).abs().max().item())
        except RuntimeError as e:
            print(dt, b, "negative scale refused", str(e)[:60])
PYEOF
echo "== check $SECONDS s"
timeout -s INT ${T_K:-150} $CLI check --device $DEV --isa native --sample --workers ${W:-8} --timeout 120 --no-progress \
  --impl 'torch.sdpa*' --impl 'triton.*' --impl 'pallas.*' --impl 'jax.*' --impl torch.flex --impl torch.eager \
  --impl 'flax.*' --impl 'hf.*sdpa*' --impl 'hf.model.*flex*' \
  --json $OUT/check2.json 2>&1 | tail -45
echo "== done $SECONDS s"; rm -f $OUT/*.lock
} > $LOG 2>&1
tail -c 11000 $LOG
