"""What a plugin author sees of a wrapper built on the module cores: the wrapped library's own
version, where an error came from (the plugin or the library), the ``wrapper`` checks of the
wrapper's own translation, and ``plugin:`` selections of a file's names."""

from importlib import metadata

from suite.environment import framework_version
from tests.conftest import PLUGINS

WRAPPERS = str(PLUGINS / "wrappers.py")


def test_framework_names_map_to_their_distributions():
    assert framework_version("hf") == metadata.version("transformers")
    assert framework_version("flax") == metadata.version("flax")
    assert framework_version("no-such-library-here") is None


def test_a_module_core_shows_the_wrapped_library_version_on_its_array_library(cli):
    proc = cli("list", "--plugin", WRAPPERS, "--impl", "wrap.ok", "--impl", "wrap.flax")
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert f"hf {metadata.version('transformers')} on torch " in lines["wrap.ok"]
    assert f"flax {metadata.version('flax')} on jax " in lines["wrap.flax"]


WRAPPER_NAMES = {"wrap.ok", "wrap.own_bug", "wrap.library_refuses", "wrap.transposed",
                 "wrap.flax"}


def _listed(proc):
    assert proc.returncode == 0, proc.stderr
    return {line.split()[0] for line in proc.stdout.splitlines()
            if line.strip() and not line.startswith("CPU instruction-set")}


def test_plugin_selection_picks_the_names_a_plugin_file_registers_and_no_builtin(cli):
    other = str(PLUGINS / "wrong_scale.py")
    by_file = cli("list", "--plugin", WRAPPERS, "--plugin", other,
                  "--impl", "plugin:tests/plugins/wrappers.py")
    assert _listed(by_file) == WRAPPER_NAMES
    every = _listed(cli("list", "--plugin", WRAPPERS, "--plugin", other, "--impl", "plugin:*"))
    assert WRAPPER_NAMES < every and not any(n.startswith(("torch.", "jax.", "hf.", "numpy"))
                                             for n in every)


def test_plugin_selection_of_a_file_not_loaded_names_the_loaded_specs(cli):
    proc = cli("list", "--plugin", WRAPPERS, "--impl", "plugin:elsewhere.py")
    assert proc.returncode != 0
    assert "no implementation registered by 'plugin:elsewhere.py'" in proc.stderr
    assert "tests/plugins/wrappers.py" in proc.stderr


def test_an_error_says_whether_the_plugin_or_the_library_raised_it():
    from suite import registry
    from suite.check import attempt
    from suite.problem import make_problem

    reg = registry.build(plugins=[WRAPPERS], builtins=False, entry_points=False)
    p = make_problem(0, B=1, L=3, E=8, H=2)
    own = attempt(reg.entries["wrap.own_bug"].impl, [p], "cpu", "float32")[1]
    assert own[0] == "error"
    assert own[1].startswith("KeyError: 'attn_mask' (in the plugin, wrappers.py:")
    assert own[1].endswith(" in call)")
    lib = attempt(reg.entries["wrap.library_refuses"].impl, [p], "cpu", "float32")[1]
    assert lib[0] == "error" and lib[1].startswith("IndexError: Dimension out of range")
    assert "(inside torch, functional.py:" in lib[1] and ", called from wrappers.py:" in lib[1]
    assert attempt(reg.entries["wrap.ok"].impl, [p], "cpu", "float32")[1] is None


def test_the_weights_round_trip_catches_a_wrapper_that_loads_them_wrong():
    from suite import registry
    from suite.problem import make_problem

    reg = registry.build(plugins=[WRAPPERS], builtins=False, entry_points=False)
    p = make_problem(0, B=1, L=3, E=8, H=2)
    assert reg.entries["wrap.ok"].impl.check_wrapper(p) == []
    wrong = reg.entries["wrap.transposed"].impl.check_wrapper(p)
    assert wrong and wrong[0].startswith("w_q: read back (8, 8) differs")
