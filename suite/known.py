"""Known library behaviours that follow the behaviour, not a test id.

A known failure listed by test id (a record of ``suite/conformance/known_failures.toml``,
read by ``suite.conformance.known_failures``) covers the cases it names. A library bug shows
wherever its conditions meet, in built-ins and in the plugins users write around the same
library: a ``KnownBehaviour`` says which behaviour (a key of
``suite.plugin.POLICIES``) the library shows, with which policy, in which array library, and
where (``suite.where.Where``: versions, instruction-set level, device, and the problems that
show it). A case that fails the spec is a *known failure* when the behaviour's conditions hold
and, with the policy applied to the affected rows, every row passes the rule: the rows are
checked, not excused. Anywhere else the spec's answer is required, and a behaviour that held
in some case of a run and was never needed there is reported as stale.

A behaviour of one kernel names it (``kernel``, as the library's dispatcher calls it, and
``kernel_when``, what its call must look like): a case that fails is credited to it only when
the call, run again under the library's profiler, reached that kernel so. A plugin on
the same library whose code never calls the kernel (plain matmuls and a softmax, a mask
passed where the kernel shows the behaviour only without one) is judged by the spec alone.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any, Callable, FrozenSet, List, Optional, Tuple

from suite.plugin import array_library
from suite.where import Where, lanes


@dataclasses.dataclass(frozen=True)
class KnownBehaviour:
    """A measured library behaviour: ``behaviour=policy`` in ``libraries`` ``where`` it holds."""

    name: str  # a stable slug, e.g. the reproducer's folder name
    behaviour: str  # a key of suite.plugin.POLICIES
    policy: str  # one of POLICIES[behaviour]
    libraries: FrozenSet[str]  # the array libraries (or frameworks) whose kernels show it
    where: Where
    reason: str
    repro: str = ""  # a standalone reproducer under docs/repro/
    upstream: str = ""  # the upstream issue, where one exists
    # Plugins on the library whose code never reaches the kernel that shows it (name globs).
    except_impls: Tuple[str, ...] = ()
    # The kernel whose calls show it (``aten::name`` for torch) and what such a call must
    # look like (the shapes of its inputs, as ``kernel_calls`` records them); "" where any
    # call of the library may.
    kernel: str = ""
    kernel_when: Optional[Callable[[list], bool]] = None

    def reached(self, calls: Optional[List[Tuple[str, list]]]) -> bool:
        """Whether ``calls`` (``kernel_calls``' record of one call; None: not traceable)
        reached this behaviour's kernel as it must: always true without a ``kernel``."""
        if not self.kernel:
            return True
        return calls is not None and any(
            name == self.kernel and (self.kernel_when is None or self.kernel_when(shapes))
            for name, shapes in calls)

    def describe(self) -> str:
        repro = f", reproducer {self.repro}" if self.repro else ""
        return (f"known behaviour {self.name} ({self.behaviour}={self.policy}): {self.reason}"
                f" [where {self.where.text()}]{repro}")


def _short_keys_no_attn_mask(p, dtype: str, isa: Optional[str]) -> bool:
    """Fewer keys than one SIMD vector of the accumulation type holds at ``isa``, and no
    attention mask reaches the kernel (no mask, or the causal flag alone)."""
    m = p.mask
    no_attn_mask = m.is_empty() or m.kinds == {"causal"}  # top-left causal, nothing else
    return p.S < lanes(isa, dtype) and no_attn_mask


def _no_attn_mask(shapes: list) -> bool:
    """_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal,
    attn_mask, scale): no attn_mask tensor."""
    return len(shapes) > 5 and not shapes[5]


KNOWN_BEHAVIOURS: Tuple[KnownBehaviour, ...] = (
    KnownBehaviour(
        name="torch-sdpa-nan-query-short-keys",
        behaviour="nan_query_rows", policy="zero", libraries=frozenset({"torch"}),
        where=Where(versions={"torch": ">=2.13,<2.14"}, device=frozenset({"cpu"}),
                    when=_short_keys_no_attn_mask,
                    when_text="fewer keys than one SIMD vector (8 float32 lanes at default "
                              "and avx2, 16 at avx512; 4 and 8 float64), no attn_mask"),
        reason="torch's CPU flash SDPA kernel returns a zero row, not NaN, for a query row "
               "holding NaN when every key sits in the vector loop's tail (measured on torch "
               "2.13.0+cpu at every level: zeros for S = 1..7 at default and avx2, 1..15 at "
               "avx512, float32/float16/bfloat16; S = 1..3 in float64 at avx2; NaN with an "
               "attn_mask); the class of pytorch #141128",
        repro="docs/repro/torch-sdpa-nan-query-short-keys/repro.py",
        upstream="https://github.com/pytorch/pytorch/issues/141128",
        # only calls that reach the kernel without a mask: not a model's eager path (matmuls
        # and a softmax) nor compiled FlexAttention (inductor's code: its own NaN-row
        # behaviour, at every key length, is listed in known_failures.toml)
        kernel="aten::_scaled_dot_product_flash_attention_for_cpu", kernel_when=_no_attn_mask),
)


def applicable(impl, problem, dtype: str, device: str, isa: Optional[str],
               exhibited: List[str], behaviours: Tuple[KnownBehaviour, ...] = KNOWN_BEHAVIOURS
               ) -> List[KnownBehaviour]:
    """The known behaviours that hold for ``impl`` on ``problem`` here and that the problem
    exhibits (``exhibited``: ``suite.check.behaviours(problem)``)."""
    library = array_library(impl)
    name = getattr(impl, "name", "")
    return [kb for kb in behaviours
            if library in kb.libraries and kb.behaviour in exhibited
            and not any(fnmatch.fnmatchcase(name, g) for g in kb.except_impls)
            and kb.where.holds(device, isa) and kb.where.holds_for(problem, dtype, isa)]


def kernel_calls(library: str, fn: Callable[[], Any]) -> Optional[List[Tuple[str, list]]]:
    """Run ``fn`` and return the kernels the library ran meanwhile, as (name, the shapes of
    its inputs: [] for an absent optional tensor or a scalar), in order; None (``fn`` not
    run) for a library the suite cannot trace. torch's profiler sees compiled code's calls
    too (inductor's extern kernels) and leaves what runs unchanged."""
    if library != "torch":
        return None
    from torch.profiler import ProfilerActivity, profile  # only for a torch plugin

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    return [(e.name, list(e.input_shapes)) for e in prof.events()]
