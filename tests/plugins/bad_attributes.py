"""Plugins whose declared attributes cannot be used: each is listed unavailable with the reason."""

from implementations.numpy.mha import NumpyMHA


class NameNotAString(NumpyMHA):
    name = 42


class ArrayLibraryList(NumpyMHA):
    name = "bad.array_library"
    array_library = ["numpy"]


class DevicesRaise(NumpyMHA):
    name = "bad.devices"

    def devices(self):
        raise RuntimeError("no driver")


class NoDtypes(NumpyMHA):
    name = "bad.dtypes"

    def dtypes(self, device):
        return ()
