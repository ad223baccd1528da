"""What a plugin author sees of a wrapper built on the module cores: the wrapped library's own
version, where an error came from (the plugin or the library), the ``wrapper`` checks of the
wrapper's own translation, and ``plugin:`` selections of a file's names."""

from importlib import metadata

from suite.results.environment import framework_version
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
                 "wrap.flax", "wrap.mask_inverted", "wrap.drops_padding", "wrap.flax_ok",
                 "wrap.flax_swapped_kv"}


def _listed(proc):
    assert proc.returncode == 0, proc.stderr
    return {line.split()[0] for line in proc.stdout.splitlines()
            if line.strip() and not line.startswith(("CPU instruction-set", "(read from"))}


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
    from suite.conformance.judge import attempt
    from suite.plugins import registry
    from suite.spec.problem import make_problem

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
    from suite.plugins import registry
    from suite.spec.problem import make_problem

    reg = registry.build(plugins=[WRAPPERS], builtins=False, entry_points=False)
    p = make_problem(0, B=1, L=3, E=8, H=2)
    assert reg.entries["wrap.ok"].impl.check_wrapper(p) == []
    wrong = reg.entries["wrap.transposed"].impl.check_wrapper(p)
    assert wrong and wrong[0].startswith("w_q: read back (8, 8) differs")
    assert wrong[0].endswith("it is the problem's transposed")


def _wrapper_outcomes(names, cases=None):
    """name -> case -> (outcome, reason) of the wrapper family on the planted wrappers."""
    from suite.conformance import catalog
    from suite.conformance.judge import run_case
    from suite.plugins import registry

    reg = registry.build(plugins=[WRAPPERS], builtins=False, entry_points=False)
    return {n: {c.name: (o.outcome, o.reason or "") for c in catalog.of_family("wrapper")
                if cases is None or c.name in cases
                for o in [run_case(reg.entries[n].impl, n, "cpu", "float32", c)]}
            for n in names}


def test_the_wrapper_family_passes_correct_wrappers_and_skips_what_they_do_not_declare():
    got = _wrapper_outcomes(["wrap.ok", "wrap.flax_ok"])
    assert got["wrap.ok"]["weights"] == ("pass", "")
    assert got["wrap.ok"]["weights_no_bias"] == ("pass", "")  # the initial bias is zeroed
    assert got["wrap.ok"]["mask_bool"] == ("pass", "")
    assert got["wrap.ok"]["mask_key_padding"] == ("unsupported", "needs valid_lens")
    assert {c: o for c, (o, _) in got["wrap.flax_ok"].items()} == {
        "weights": "pass", "weights_no_bias": "pass", "mask_key_padding": "pass",
        "mask_causal": "pass", "mask_bool": "pass", "mask_bias": "unsupported",
        "mask_combined": "unsupported"}


def test_the_wrapper_family_blames_the_wrapper_for_its_own_mask_and_weights():
    got = _wrapper_outcomes(["wrap.mask_inverted", "wrap.drops_padding", "wrap.flax_swapped_kv",
                             "wrap.transposed"])
    wrong = "the wrapper's own translation is wrong, not the library"
    outcome, reason = got["wrap.mask_inverted"]["mask_bool"]
    assert outcome == "fail" and reason.startswith(wrong)
    assert "mask turned over matches: its True/False convention is inverted" in reason
    outcome, reason = got["wrap.drops_padding"]["mask_key_padding"]
    assert outcome == "fail" and "the canonical mask without its valid_lens part" in reason
    assert got["wrap.drops_padding"]["mask_bool"][0] == "pass"  # its boolean mask is right
    outcome, reason = got["wrap.flax_swapped_kv"]["weights"]
    assert outcome == "fail" and reason.startswith(wrong)
    assert "w_k: read back (16, 16) differs" in reason and "it holds the problem's w_v" in reason
    assert got["wrap.flax_swapped_kv"]["mask_bool"][0] == "pass"
    assert got["wrap.transposed"]["weights"][0] == "fail"


def test_a_wrapper_with_its_own_layout_and_no_inverse_is_unsupported_not_failed():
    """A packed in_proj_weight (torch.nn), a Conv1D, dict mask arguments, a Flax module's own
    parameter tree: nothing the suite can read back, so unsupported with the reason."""
    from suite.conformance import catalog
    from suite.conformance.judge import run_case
    from suite.plugins import registry

    reg = registry.build(builtins=True, entry_points=False, env={})
    impl = reg.entries["torch.nn"].impl
    weights = run_case(impl, "torch.nn", "cpu", "float32", catalog.get("wrapper", "weights"))
    assert weights.outcome == "unsupported"
    assert "load_weights is the wrapper's own and it gives no read_weights" in weights.reason
    mask = run_case(impl, "torch.nn", "cpu", "float32", catalog.get("wrapper", "mask_bool"))
    assert mask.outcome == "unsupported" and "module_mask returns dict" in mask.reason
    numpy = run_case(reg.entries["numpy"].impl, "numpy", "cpu", "float32",
                     catalog.get("wrapper", "weights"))
    assert numpy.outcome == "unsupported" and numpy.reason.startswith("not a module wrapper")


def test_whole_model_wrappers_read_their_first_layers_weights_back():
    """HFModelCore reads ``layers`` inside its ``attention`` path (and the added output
    projection); a model with its own weight layout (GPT-2's packed c_attn) is unsupported."""
    import pytest

    from implementations.hf import model as hf_model
    from suite.plugins.interface import Unsupported
    from suite.spec.problem import make_problem

    p = make_problem(0, B=2, L=5, E=8, H=2)
    named = {c.name: c for c in hf_model.variants()}
    for name in ("hf.model.llama[eager]", "hf.model.bert[eager]"):
        assert named[name]().check_wrapper(p) == [], name
    with pytest.raises(Unsupported, match="load_weights is the wrapper's own"):
        named["hf.model.gpt2[eager]"]().check_wrapper(p)
