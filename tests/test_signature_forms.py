"""Each built-in declares every mask form its library's signature takes.

The parameters are read from the installed library (``inspect.signature``; SDPA, a builtin
without one, from the signature line of its own docstring), and each mask parameter, and
each pair the library takes together, is mapped to the forms in ``MASK_FORMS`` that pass it
(``FORMS_OF``). A built-in that leaves out a form of a parameter its library has fails here:
a new keyword (say jax's ``query_seq_lengths``) cannot go unexercised by the mask_forms
family. A parameter the installed release lacks requires nothing.
"""

from __future__ import annotations

import inspect
import re
from typing import Callable, Dict, FrozenSet, Tuple

import pytest

from suite.plugins.declarations import MASK_FORMS

Params = Tuple[str, ...]
ATTN_4D = ("BHLS", "B1LS", "11LS", "B11S", "BHL1")


def _attn(kind: str, shapes) -> FrozenSet[str]:
    return frozenset(f"{kind}_{s}" for s in shapes)


# library -> (a parameter, or parameters taken together) -> the forms that pass them.
FORMS_OF: Dict[str, Dict[Params, FrozenSet[str]]] = {
    "jax.nn.dot_product_attention": {
        ("mask",): _attn("bool", ATTN_4D + ("LS",)),
        ("bias",): _attn("float", ATTN_4D + ("LS",)),
        ("is_causal",): frozenset({"causal_flag"}),
        ("query_seq_lengths",): frozenset({"q_lengths"}),
        ("key_value_seq_lengths",): frozenset({"kv_lengths"}),
        ("query_seq_lengths", "key_value_seq_lengths"): frozenset({"q_lengths+kv_lengths"}),
        ("is_causal", "key_value_seq_lengths"): frozenset({"causal_flag+kv_lengths"}),
        ("is_causal", "mask"): frozenset({"causal_flag+bool_B11S"}),
        ("local_window_size",): frozenset({"local_window"}),
        ("local_window_size", "key_value_seq_lengths"): frozenset({"local_window+kv_lengths"}),
        ("local_window_size", "is_causal"): frozenset({"local_window+causal_flag"}),
    },
    "torch.nn.functional.scaled_dot_product_attention": {
        ("attn_mask",): _attn("bool", ATTN_4D + ("LS",)) | _attn("float", ATTN_4D + ("LS",)),
        ("is_causal",): frozenset({"causal_flag"}),
    },
    "torch.nn.MultiheadAttention.forward": {
        ("attn_mask",): _attn("bool", ("LS", "BHxLS")) | _attn("float", ("LS", "BHxLS")),
        ("key_padding_mask",): frozenset({"kpm_bool", "kpm_float"}),
        ("key_padding_mask", "attn_mask"): frozenset({"kpm_bool+bool_LS", "kpm_float+float_LS",
                                                       "kpm_bool+bool_BHxLS"}),
        ("is_causal",): frozenset({"causal_flag"}),
        ("is_causal", "key_padding_mask"): frozenset({"causal_flag+kpm_bool"}),
        ("is_causal", "attn_mask"): frozenset({"causal_hint+bool_LS"}),
    },
    "keras.layers.MultiHeadAttention.call": {
        ("attention_mask",): frozenset({"bool_BLS"}),
        ("use_causal_mask",): frozenset({"causal_flag"}),
        ("use_causal_mask", "attention_mask"): frozenset({"causal_flag+bool_BLS"}),
        ("value_mask",): frozenset({"kpm_bool"}),
        ("value_mask", "attention_mask"): frozenset({"kpm_bool+bool_BLS"}),
        ("use_causal_mask", "value_mask"): frozenset({"causal_flag+kpm_bool"}),
        ("query_mask",): frozenset({"qpm_bool"}),
        ("query_mask", "value_mask"): frozenset({"qpm_bool+kpm_bool"}),
    },
    "flax.nnx.MultiHeadAttention.__call__": {
        ("mask",): _attn("bool", ATTN_4D),
        ("is_causal",): frozenset({"causal_flag"}),
        ("is_causal", "mask"): frozenset({"causal_flag+bool_B11S"}),
    },
}


def _sdpa_params(fn: Callable) -> FrozenSet[str]:
    """SDPA is a builtin without a signature: its docstring opens with one."""
    head = re.search(r"scaled_dot_product_attention\(([^)]*)\)", fn.__doc__ or "")
    assert head, "SDPA's docstring no longer opens with its signature"
    return frozenset(p.split("=")[0].strip() for p in head.group(1).split(","))


def _params(library: str) -> FrozenSet[str]:
    """The parameter names of ``library``'s installed callable (skips where it is absent)."""
    if library.startswith("jax."):
        jax = pytest.importorskip("jax")
        return frozenset(inspect.signature(jax.nn.dot_product_attention).parameters)
    if library == "torch.nn.functional.scaled_dot_product_attention":
        torch = pytest.importorskip("torch")
        return _sdpa_params(torch.nn.functional.scaled_dot_product_attention)
    if library.startswith("torch."):
        torch = pytest.importorskip("torch")
        return frozenset(inspect.signature(torch.nn.MultiheadAttention.forward).parameters)
    if library.startswith("keras."):
        pytest.importorskip("implementations.keras.mha")  # picks the backend, then keras
        keras = pytest.importorskip("keras")
        return frozenset(inspect.signature(keras.layers.MultiHeadAttention.call).parameters)
    nnx = pytest.importorskip("flax.nnx")
    return frozenset(inspect.signature(nnx.MultiHeadAttention.__call__).parameters)


def _builtins(library: str):
    """The built-in classes whose mask forms are ``library``'s (importorskip where absent)."""
    if library.startswith("jax."):
        pytest.importorskip("jax")
        from implementations.jax.nn import JaxNN
        return [JaxNN]
    if library == "torch.nn.functional.scaled_dot_product_attention":
        pytest.importorskip("torch")
        from implementations.torch.sdpa import TorchSDPA
        return [TorchSDPA]
    if library.startswith("torch."):
        pytest.importorskip("torch")
        from implementations.torch.fmha import TorchFMHA, TorchFMHAWeights
        from implementations.torch.nn import TorchNN, TorchNNFast, TorchNNSDPA
        return [TorchNN, TorchNNSDPA, TorchNNFast, TorchFMHA, TorchFMHAWeights]
    if library.startswith("keras."):
        keras_mha = pytest.importorskip("implementations.keras.mha")
        return [c for c in vars(keras_mha).values()
                if isinstance(c, type) and issubclass(c, keras_mha.KerasMHA)]
    pytest.importorskip("flax.nnx")
    from implementations.jax.flax import FlaxMHA, FlaxMHAWeights
    return [FlaxMHA, FlaxMHAWeights]


def missing(declared: FrozenSet[str], params: FrozenSet[str],
            table: Dict[Params, FrozenSet[str]]) -> Dict[Params, FrozenSet[str]]:
    """The forms of ``table`` whose parameters are all in ``params`` and which ``declared``
    leaves out, by parameter."""
    out = {}
    for names, forms in table.items():
        if set(names) <= params and forms - declared:
            out[names] = forms - declared
    return out


def test_the_table_names_only_forms_the_family_has():
    for library, table in FORMS_OF.items():
        for names, forms in table.items():
            assert forms and forms <= set(MASK_FORMS), (library, names, forms - set(MASK_FORMS))


def test_an_omitted_form_of_a_taken_parameter_is_found():
    table = FORMS_OF["jax.nn.dot_product_attention"]
    every = frozenset().union(*table.values())
    params = frozenset({"mask", "query_seq_lengths", "key_value_seq_lengths"})
    assert missing(every - {"q_lengths"}, params, table) == {("query_seq_lengths",):
                                                              frozenset({"q_lengths"})}
    # A release without the keyword requires none of its forms.
    assert missing(every - {"q_lengths", "q_lengths+kv_lengths"},
                   params - {"query_seq_lengths"}, table) == {}


@pytest.mark.parametrize("library", sorted(FORMS_OF))
def test_each_builtin_declares_every_form_its_signature_takes(library):
    params = _params(library)
    table = FORMS_OF[library]
    taken = {p for names in table for p in names} & params
    assert taken, f"{library}: none of the mapped mask parameters is in its signature"
    for cls in _builtins(library):
        gaps = missing(frozenset(cls.mask_forms), params, table)
        assert not gaps, f"{cls.name} leaves out forms {library} takes: {gaps}"
