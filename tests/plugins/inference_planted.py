"""A NumPy plugin that declares none of the inference forms (decode, packed, paged): the
property-based family's ``random_inference`` is unsupported on it, without drawing."""

from implementations.numpy.mha import NumpyMHA


class NoForms(NumpyMHA):
    """numpy without the inference forms: prefill only."""

    name = "numpy.no_forms"
    features = NumpyMHA.features - {"decode", "packed", "paged"}
