"""Module names before the house move (suite/ in wings, implementations/ by framework), kept
importable so that plugins written against them keep working: importing one warns once with
its new name (a DeprecationWarning) and hands out the new module's names.

``install(package, moved)`` puts a finder for ``package.<old>`` on ``sys.meta_path`` and
returns the package's ``__getattr__`` for ``from package import <old>``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from typing import Any, Callable, Dict, Tuple

SUITE: Dict[str, Tuple[str, ...]] = {
    'adapters': ('suite.plugins.adapters',),
    'agreement': ('suite.spec.agreement',),
    'benchmarks': ('suite.sweep.benchmarks',),
    'cache': ('suite.plugins.cache',),
    'cases': ('suite.conformance.cases',),
    'catalog': ('suite.conformance.catalog',),
    'check': ('suite.conformance.judge',),
    'conformance_session': ('suite.conformance.session',),
    'contracts': ('suite.conformance.families.contracts',),
    'cover': ('suite.conformance.cover',),
    'decode_cases': ('suite.conformance.families.decode',),
    'diagnose': ('suite.spec.diagnose',),
    'dropout_cases': ('suite.conformance.families.dropout',),
    'environment': ('suite.results.environment',),
    'false_alarms': ('suite.conformance.false_alarms',),
    'fidelity': ('suite.sweep.fidelity',),
    'generation_cases': ('suite.conformance.families.generation',),
    'isa': ('suite.plugins.isa',),
    'known': ('suite.plugins.known_behaviours',),
    'layouts': ('suite.spec.layouts',),
    'mask_forms': ('suite.conformance.families.mask_forms',),
    'measure': ('suite.sweep.measure',),
    'oracle': ('suite.spec.oracle',),
    'oracle_grad': ('suite.spec.oracle_grad',),
    'outputs': ('suite.plugins.fetch_check',),
    'packed_cases': ('suite.conformance.families.packed',),
    'paged_cases': ('suite.conformance.families.paged',),
    'paging': ('suite.spec.paging',),
    'plugin': ('suite.plugins.interface', 'suite.plugins.declarations'),
    'point': ('suite.sweep.point',),
    'probes': ('suite.plugins.probes',),
    'problem': ('suite.spec.problem',),
    'property_cases': ('suite.conformance.families.properties',),
    'records': ('suite.results.records',),
    'registry': ('suite.plugins.registry',),
    'repro': ('suite.conformance.repro',),
    'sample': ('suite.conformance.sample',),
    'selection': ('suite.plugins.selection',),
    'shard': ('suite.sweep.shard',),
    'sweep': ('suite.sweep.presets',),
    'sweep_session': ('suite.sweep.session',),
    'timing': ('suite.sweep.timing',),
    'variant_cases': ('suite.conformance.families.variants',),
    'variants': ('suite.spec.variants',),
    'vocab': ('suite.results.vocabulary',),
    'where': ('suite.plugins.conditions',),
    'wrapper_cases': ('suite.conformance.families.wrapper',),
}

IMPLEMENTATIONS: Dict[str, Tuple[str, ...]] = {
    'flax_mha': ('implementations.jax.flax',),
    'hf_model': ('implementations.hf.model',),
    'hf_transformers': ('implementations.hf.transformers',),
    'jax_common': ('implementations.jax.common',),
    'jax_jit': ('implementations.jax.jit',),
    'jax_nn': ('implementations.jax.nn',),
    'keras_common': ('implementations.keras.common',),
    'keras_mha': ('implementations.keras.mha',),
    'numpy_flash': ('implementations.numpy.flash',),
    'numpy_mha': ('implementations.numpy.mha',),
    'numpy_tiles': ('implementations.numpy.tiles',),
    'numpy_workers': ('implementations.numpy.workers',),
    'pallas_attention': ('implementations.kernels.pallas',),
    'torch_common': ('implementations.torch.common',),
    'torch_compiled': ('implementations.torch.compiled',),
    'torch_eager': ('implementations.torch.eager',),
    'torch_fmha': ('implementations.torch.fmha',),
    'torch_nn': ('implementations.torch.nn',),
    'torch_sdpa': ('implementations.torch.sdpa',),
    'triton_flash': ('implementations.kernels.triton_flash',),
    'triton_kernels': ('implementations.kernels.triton_kernels',),
}


class _Alias(types.ModuleType):
    """An old module name: its attributes are the new modules' (the first that has one)."""

    def __init__(self, name: str, targets: Tuple[str, ...]) -> None:
        super().__init__(name, f"moved to {', '.join(targets)}")
        self.__targets = targets

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        for target in self.__targets:
            module = importlib.import_module(target)
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(f"module {self.__name__!r} (moved to {', '.join(self.__targets)}) "
                             f"has no attribute {attr!r}")

    def __dir__(self):
        return sorted({n for t in self.__targets for n in dir(importlib.import_module(t))})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, package: str, moved: Dict[str, Tuple[str, ...]]) -> None:
        self.package, self.moved = package, moved

    def find_spec(self, fullname: str, path: Any, target: Any = None):
        head, _, old = fullname.partition(".")
        if head == self.package and old in self.moved:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        old = spec.name.partition(".")[2]
        targets = self.moved[old]
        warnings.warn(f"{spec.name} moved to {' and '.join(targets)}; import it from there "
                      f"(the old name will be removed)", DeprecationWarning, stacklevel=2)
        return _Alias(spec.name, targets)

    def exec_module(self, module) -> None:
        pass


def install(package: str, moved: Dict[str, Tuple[str, ...]]) -> Callable[[str], Any]:
    if not any(isinstance(f, _Finder) and f.package == package for f in sys.meta_path):
        sys.meta_path.append(_Finder(package, moved))

    def __getattr__(name: str) -> Any:
        if name in moved:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__
