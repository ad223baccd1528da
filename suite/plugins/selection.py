"""Which implementations, devices and dtypes a run covers: built once, passed down.

``--impl`` and ``--plugin`` are declared here once, for the command line (argparse) and
for pytest (the ``pytest11`` plugin); a ``Selection`` is built from either and the
sessions read it rather than the options.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, List, Sequence, Tuple

from suite.plugins import registry as _registry

# (flag, argparse/pytest keyword arguments): the one declaration of each selection option.
IMPL_OPTION = ("--impl", dict(action="append", default=[], metavar="GLOB",
                              help="implementation name or glob, e.g. 'torch.*' (repeatable; "
                                   "default all available); 'plugin:path/to/file.py' (or a "
                                   "module) selects only the names that --plugin spec "
                                   "registers, 'plugin:*' those of every --plugin, never a "
                                   "built-in's"))
PLUGIN_OPTION = ("--plugin", dict(action="append", default=[], metavar="SPEC",
                                  help="register an implementation: module:Class or "
                                       "path/to/file.py[:Class] (repeatable; also "
                                       f"${_registry.PLUGINS_ENV}, comma separated)"))


def add_impl_plugin(p: Any) -> None:
    """Declare --impl and --plugin on an argparse parser or a pytest option group."""
    add = getattr(p, "add_argument", None) or p.addoption  # argparse, or pytest
    for flag, kwargs in (IMPL_OPTION, PLUGIN_OPTION):
        add(flag, **kwargs)


@dataclasses.dataclass(frozen=True)
class Selection:
    """Implementation globs, --plugin specs, device prefixes and dtypes (empty: all)."""

    impl: Tuple[str, ...] = ()
    plugins: Tuple[str, ...] = ()
    devices: Tuple[str, ...] = ()
    dtypes: Tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: Any) -> Selection:
        """From a pytest config's options (the ``pytest11`` plugin declares them)."""
        return cls(*(tuple(config.getoption(o) or ()) for o in
                     ("--impl", "--plugin", "--device", "--dtype")))

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Selection:
        """From a parsed command line; an option the command lacks selects everything."""
        return cls(*(tuple(getattr(args, a, None) or ()) for a in
                     ("impl", "plugin", "device", "dtype")))

    def registry(self) -> _registry.Registry:
        """The process's registry, with this selection's --plugin specs registered."""
        return _registry.shared(list(self.plugins))

    def entries(self, available_only: bool = False) -> List[_registry.Entry]:
        return self.registry().select(list(self.impl) or None, available_only=available_only)

    def device(self, device: str) -> bool:
        return not self.devices or any(device.startswith(w) for w in self.devices)

    def dtype(self, dtype: str) -> bool:
        return not self.dtypes or dtype in self.dtypes

    def pytest_args(self) -> List[str]:
        """The same selection as pytest options (for a session in a worker process)."""
        out: List[str] = []
        for flag, values in (("--impl", self.impl), ("--plugin", self.plugins),
                             ("--device", self.devices), ("--dtype", self.dtypes)):
            for v in values:
                out += [flag, v]
        return out


def targets(selection: Selection) -> Sequence[tuple]:
    """(entry, device, dtype) triples of the available implementations selected."""
    return [(e, d, t) for e in selection.entries(available_only=True)
            for d in e.impl.devices() if selection.device(d)
            for t in e.impl.dtypes(d) if selection.dtype(t)]


def only_plugins(*names: str) -> List[str]:
    """pytest arguments that load the suite's plugin and ``names`` (module names) and no
    other: pytest otherwise imports, in the run and in each xdist worker, every plugin an
    installed package registers (executorch's hydra-core and kgb, anyio): a one-case numpy
    check took 4.9 s of CPU with them, 1.8-2.2 s without. A user's own:
    ``-- -p NAME`` after the suite's arguments."""
    out = ["--disable-plugin-autoload", "-p", "suite.pytest_plugin", "-p", "no:cacheprovider"]
    for name in names:
        out += ["-p", name]
    return out
