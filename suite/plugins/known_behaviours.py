"""Known library behaviours that follow the behaviour, not a test id: records of
``suite/plugins/known_behaviours.toml`` (``[[behaviour]]`` tables), read and checked here.

A known failure listed by test id (a record of ``suite/conformance/known_failures.toml``,
read by ``suite.conformance.known_failures``) covers the cases it names. A library bug shows
wherever its conditions meet, in built-ins and in the plugins users write around the same
library: a ``KnownBehaviour`` says which behaviour (a key of
``suite.plugins.declarations.POLICIES``) the library shows, with which policy, in which array library, and
where (``suite.plugins.conditions.Where``: versions, instruction-set level, device, and the problems that
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
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple, Type, Union

from suite.plugins.conditions import Where, WhereError, lanes, parse
from suite.plugins.declarations import POLICIES
from suite.plugins.interface import array_library


@dataclasses.dataclass(frozen=True)
class KnownBehaviour:
    """A measured library behaviour: ``behaviour=policy`` in ``libraries`` ``where`` it holds."""

    name: str  # a stable slug, e.g. the reproducer's folder name
    behaviour: str  # a key of suite.plugins.declarations.POLICIES
    policy: str  # one of POLICIES[behaviour]
    libraries: FrozenSet[str]  # the array libraries (or frameworks) whose kernels show it
    where: Where
    reason: str  # one line
    repro: str = ""  # a standalone reproducer under docs/repro/
    upstream: str = ""  # the upstream issue, where one exists
    kind: str = "bug"  # bug | behaviour (documented or by design)
    versions: str = ""  # the versions it was measured on
    detail: str = ""  # the long explanation and the measurements
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


# Conditions a record names: on a problem (``when``: predicate(problem, dtype, isa), and the
# words that say it) and on a kernel's call (``kernel_when``: predicate(input shapes)).
WHEN: Dict[str, Tuple[Callable[..., bool], str]] = {
    "short_keys_no_attn_mask": (
        _short_keys_no_attn_mask,
        "fewer keys than one SIMD vector (8 float32 lanes at default and avx2, 16 at avx512; "
        "4 and 8 float64), no attn_mask"),
}
KERNEL_WHEN: Dict[str, Callable[[list], bool]] = {"no_attn_mask": _no_attn_mask}
KNOWN_BEHAVIOURS_FILE = Path(__file__).resolve().parent / "known_behaviours.toml"
KINDS = ("bug", "behaviour")
_REQUIRED = ("name", "behaviour", "policy", "libraries", "kind", "reason")
_OPTIONAL = ("condition", "when", "except_impls", "kernel", "kernel_when", "library",
             "versions", "upstream", "reproducer", "detail")


class DeclarationError(ValueError):
    """A declarations file that cannot be read, or a record in it that is wrong (one line
    naming the file and the record)."""


def read_tables(path: Union[str, Path], table: str,
                error: Type[DeclarationError] = DeclarationError) -> List[dict]:
    """The ``[[table]]`` records of a TOML file; ``error`` (one line) for a file that cannot
    be read, is not TOML, or holds anything else."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except IsADirectoryError:
        raise error(f"expected a TOML file of [[{table}]] records, got the folder "
                    f"{path}") from None
    except FileNotFoundError:
        raise error(f"expected a TOML file of [[{table}]] records, got {path}, which does "
                    "not exist") from None
    except UnicodeDecodeError:
        raise error(f"expected a UTF-8 text file, got binary data in {path}") from None
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML: {exc}") from None
    extra = sorted(set(data) - {table})
    if extra:
        raise error(f"{path}: unknown table(s) {', '.join(extra)}; expected [[{table}]] "
                    "records only")
    records = data.get(table, [])
    if not isinstance(records, list):
        raise error(f"{path}: {table}: expected [[{table}]] records")
    return records


def check_fields(raw: Any, where: str, required: Tuple[str, ...], optional: Tuple[str, ...],
                 error: Type[DeclarationError] = DeclarationError) -> None:
    """One line for a record that is not a table, has a field not in ``required`` or
    ``optional``, or lacks a required one."""
    if not isinstance(raw, dict):
        raise error(f"{where}: expected a table, got {raw!r}")
    unknown = sorted(set(raw) - set(required) - set(optional))
    if unknown:
        raise error(f"{where}: unknown field(s) {', '.join(unknown)}; known: "
                    f"{', '.join(required + optional)}")
    missing = [f for f in required if f not in raw]
    if missing:
        raise error(f"{where}: missing required field(s) {', '.join(missing)}")


def record_where(raw: Any, path: Union[str, Path], number: int) -> str:
    """How a one-line error names a record: its file, its number there and its name."""
    name = raw.get("name") if isinstance(raw, dict) else None
    return f"{path}, record {number}" + (f" ({name})" if isinstance(name, str) else "")


def text_fields(raw: Dict[str, Any], where: str, fields: Iterable[str],
                error: Type[DeclarationError] = DeclarationError) -> Dict[str, str]:
    """The record's string ``fields``, stripped ('' where absent); one line for a field that
    is not a string."""
    text = {}
    for field in fields:
        value = raw.get(field, "")
        if not isinstance(value, str):
            raise error(f"{where}: {field}: expected a string, got {value!r}")
        text[field] = value.strip()
    return text


def _behaviour(raw: Any, path: str, number: int) -> KnownBehaviour:
    """One ``[[behaviour]]`` table, validated."""
    where = record_where(raw, path, number)
    check_fields(raw, where, _REQUIRED, _OPTIONAL)
    lists = {}
    for field in ("libraries", "except_impls"):
        value = raw.get(field, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or (
                field == "libraries" and not value):
            raise DeclarationError(f"{where}: {field}: expected a list of names, got {value!r}")
        lists[field] = value
    text = text_fields(raw, where, set(_REQUIRED + _OPTIONAL) - set(lists))
    if text["behaviour"] not in POLICIES:
        raise DeclarationError(f"{where}: behaviour: expected one of "
                               f"{', '.join(sorted(POLICIES))}, got {text['behaviour']!r}")
    if text["policy"] not in POLICIES[text["behaviour"]]:
        raise DeclarationError(f"{where}: policy: expected one of "
                               f"{', '.join(POLICIES[text['behaviour']])} for "
                               f"{text['behaviour']}, got {text['policy']!r}")
    if text["kind"] not in KINDS:
        raise DeclarationError(f"{where}: kind: expected one of {', '.join(KINDS)}, got "
                               f"{text['kind']!r}")
    if not text["reason"] or "\n" in text["reason"]:
        raise DeclarationError(f"{where}: reason: expected one line, got {text['reason']!r}")
    for field, known in (("when", WHEN), ("kernel_when", KERNEL_WHEN)):
        if text[field] and text[field] not in known:
            raise DeclarationError(f"{where}: {field}: expected one of "
                                   f"{', '.join(sorted(known))}, got {text[field]!r}")
    try:
        condition = parse(text["condition"])
    except WhereError as exc:
        raise DeclarationError(f"{where}: condition: {exc}") from None
    if text["when"]:
        when, when_text = WHEN[text["when"]]
        condition = dataclasses.replace(condition, when=when, when_text=when_text)
    return KnownBehaviour(
        name=text["name"], behaviour=text["behaviour"], policy=text["policy"],
        libraries=frozenset(lists["libraries"]), where=condition, reason=text["reason"],
        repro=text["reproducer"], upstream=text["upstream"], kind=text["kind"],
        versions=text["versions"], detail=text["detail"],
        except_impls=tuple(lists["except_impls"]), kernel=text["kernel"],
        kernel_when=KERNEL_WHEN.get(text["kernel_when"]))


def read_behaviours(path: Union[str, Path] = KNOWN_BEHAVIOURS_FILE
                    ) -> Tuple[KnownBehaviour, ...]:
    """The known behaviours of a TOML file (``[[behaviour]]`` records), validated."""
    out = tuple(_behaviour(raw, str(path), i)
                for i, raw in enumerate(read_tables(path, "behaviour"), 1))
    names = [k.name for k in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DeclarationError(f"{path}: name(s) used twice: {', '.join(twice)}")
    return out


KNOWN_BEHAVIOURS: Tuple[KnownBehaviour, ...] = read_behaviours()


def applicable(impl, problem, dtype: str, device: str, isa: Optional[str],
               exhibited: List[str], behaviours: Tuple[KnownBehaviour, ...] = KNOWN_BEHAVIOURS
               ) -> List[KnownBehaviour]:
    """The known behaviours that hold for ``impl`` on ``problem`` here and that the problem
    exhibits (``exhibited``: ``suite.conformance.judge.behaviours(problem)``)."""
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
