"""Paths of one module that must agree (``Contract(..., "agrees", ...)``), planted: a module
that always soft-caps its logits at 50 (as a Gemma 2 config does) without the problem saying
so, whose eager path caps and whose fused path drops the cap, as a model release's default
path once did; and a pair declaring the cap where the fused path drops the problem's cap.
Each is numpy's reference with one thing changed; tests/test_path_agreement.py judges them."""

from __future__ import annotations

import dataclasses

from implementations.numpy.mha import NumpyMHA
from suite.plugins.adapters import ScoreVariants
from suite.plugins.declarations import VARIANT_FEATURES, Contract

INTRINSIC_CAP = 50.0


class CappedEager(NumpyMHA):
    """The module's eager path: every score capped at 50, a config value, not the problem's
    (it declares no variant, so the suite cannot give it one)."""

    name = "paths.capped[eager]"
    features = NumpyMHA.features - VARIANT_FEATURES

    def attend(self, q, k, v, mask, scale, need_weights):
        variants = mask.variants or ScoreVariants()
        capped = dataclasses.replace(variants, softcap=INTRINSIC_CAP)
        return super().attend(q, k, v, mask.replace(variants=capped), scale, need_weights)


class CappedFusedDropsCap(NumpyMHA):
    """The module's fused path, the bug: the config's cap never reaches it."""

    name = "paths.capped[fused]"
    features = NumpyMHA.features - VARIANT_FEATURES
    contracts = (Contract("agrees_with_eager", "agrees", "paths.capped[eager]",
                          "the fused path computes what the eager path does"),)


class CappedFused(CappedEager):
    """The module's fused path, fixed: it caps as the eager path does."""

    name = "paths.capped[fused_fixed]"
    contracts = CappedFusedDropsCap.contracts


class Declared(NumpyMHA):
    """A module declaring every variant: its eager path is numpy's reference."""

    name = "paths.declared[eager]"


class DeclaredFusedDropsCap(NumpyMHA):
    """Its fused path drops the problem's cap (the variants family catches this too; the
    contract's problems carry the cap both declare)."""

    name = "paths.declared[fused]"
    contracts = (Contract("agrees_with_eager", "agrees", "paths.declared[eager]",
                          "the fused path computes what the eager path does"),)

    def cap(self, scores, cap):
        return scores
