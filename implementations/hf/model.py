"""hf.model.*: a whole Hugging Face model, its own mask pipeline, checked at its first attention.

``HFModelCore`` builds a model from a small config (``AutoModel.from_config``, one layer, the
problem's sizes, random initial weights, no download), loads the canonical q/k/v/o weights
into its first attention layer and calls the model as a user does: ``inputs_embeds`` and a
2-D ``attention_mask`` (B, S) of ones and zeros. The model builds its own 4-D mask from that
(``create_causal_mask``, ``create_sliding_window_causal_mask``, ``create_bidirectional_mask``
or its own code) for its attention implementation (eager, sdpa, flex_attention) and its
causality (the config's: a decoder is causal, an encoder is not); that mask pipeline is what
these names measure.

The canonical problem, posed so that the model's own mask is its equivalent:

- self-attention (``kv_source = "self"``): one input is query, key and value;
- ``valid_lens`` (B,) is the 2-D ``attention_mask``: HF padding masks keys. A padded query
  row still attends the valid keys (causally in a decoder), which is what the canonical key
  padding asks too, so every row is compared; per-query lengths (B, L) have no 2-D form
  (unsupported);
- causal exactly when the model is (a problem with the other causality is unsupported);
- a sliding window (``sliding_window`` in the config) only from the ``local_window+causal_flag``
  mask form: the model's window W attends keys i - W < j <= i, so W = left + 1; every other
  problem gets W = L, the smallest window that masks nothing.

What reaches the first attention layer is controlled, not repaired: a forward pre-hook hands
it the problem's query as its hidden states (so the embeddings, position embeddings and the
layer norm before attention are out of the path) and the model's own other arguments,
the mask included; a forward hook takes its output and stops the model there. The canonical
problem has no positional encoding, so a rotary model's ``position_embeddings`` are the
identity (cos = 1, sin = 0), as ``hf.llama`` does. A layer without its output projection
(BERT keeps it in ``BertSelfOutput`` with a residual and a LayerNorm) gets the canonical
``W_o`` as a plain linear layer after it. Models are created in float64, loaded, then cast to
the run's dtype (one rounding).

Training mode (``Problem.dropout``, feature ``dropout``): the config's attention dropout
(``attention_dropout``, GPT-2's ``attn_pdrop``, BERT's ``attention_probs_dropout_prob``) is
the problem's, every other dropout of the config stays 0 (BLOOM's ``hidden_dropout`` is in
its attention layer's residual add), and ``TorchModuleCore`` puts the model in ``train()``
mode; each model's attention code drops its softmax's weights (eager: ``F.dropout``; sdpa:
``dropout_p``). torch's RNG is seeded per call from the problem's digest and the draw's
index (``SeededDropout``) inside ``torch.random.fork_rng``, so each call draws a new mask, a
run replays, and nothing else's draws move. The flex names leave ``dropout`` undeclared:
transformers' ``flex_attention_forward`` raises for any dropout above 0 ("`flex_attention`
does not support `dropout`"). A model is measured on its own self-attention: a problem with
Lq != Lk is unsupported, so the dropout family's cases (all cross-attention) are too;
``tests/test_dropout.py`` judges its square forms.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import transformers

from implementations.torch.common import TorchModuleCore
from suite.plugins import adapters
from suite.plugins.adapters import dropout_seed
from suite.plugins.declarations import Contract, Deviation
from suite.plugins.interface import Unsupported
from suite.spec.problem import Problem
from suite.spec.variants import alibi_slopes, segment_positions

# The attention implementations a name may use, as transformers spells them.
ATTN_IMPLEMENTATIONS = {"eager": "eager", "sdpa": "sdpa", "flex": "flex_attention"}


class _Stop(Exception):
    """Raised by the hook on the first attention layer: the rest of the model is not needed."""




def attention_dropout(p: Problem) -> float:
    """The config's attention dropout for ``p``: its rate in training mode, else 0."""
    return 0.0 if p.dropout is None else float(p.dropout)


# Where transformers' configs keep the attention's dropout rate (most models; GPT-2's; BERT's).
DROPOUT_FIELDS = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob")


def check_config_dropout(config: Any, p: Problem) -> None:
    """A training-mode problem needs a config whose attention dropout is the problem's: a
    subclass that inherits the core's ``dropout`` feature but whose ``config`` never sets
    the rate (written before the core declared it) would run the family's cases with no
    dropout at all and fail a correct model, so it is unsupported, saying what to set. A
    config with none of ``DROPOUT_FIELDS`` is left to the cases."""
    if p.dropout is None:
        return
    found = {f: getattr(config, f) for f in DROPOUT_FIELDS if hasattr(config, f)}
    if found and not any(_rate(v) == float(p.dropout) for v in found.values()):
        said = ", ".join(f"{k}={v!r}" for k, v in found.items())
        raise Unsupported(
            f"training mode (dropout {p.dropout}): the config's attention dropout ({said}) is "
            f"not the problem's: config(p) passes attention_dropout(p) "
            f"(implementations.hf.model), or the name leaves 'dropout' out of its features")


def _rate(value: Any) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class SeededDropout:
    """Training mode for a torch module plugin: ``seed_dropout`` gives the prepared state
    this draw's seed (training mode only), and the forward runs with torch's RNG seeded by
    it inside ``torch.random.fork_rng`` (the process's RNG is left as it was)."""

    def seed_dropout(self, state: Dict[str, Any], p: Problem) -> Dict[str, Any]:
        if p.dropout is not None:
            state["dropout_seed"] = dropout_seed(self, p)
        return state

    def forward(self, state: Dict[str, Any]):
        seed = state.get("dropout_seed")
        if seed is None:
            return super().forward(state)
        dev = state["device"]
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
            torch.manual_seed(seed)
            return super().forward(state)


class HFModelCore(SeededDropout, TorchModuleCore):
    """A whole HF model as a plugin, measured at its first attention layer.

    Subclasses write ``config(problem)`` (a small config: the problem's width and heads, one
    layer) and name the first attention layer (``attention``, a path in the base model) and
    its q/k/v/o ``nn.Linear`` layers (``layers``, paths in that layer; ``"o": None`` when the
    layer has no output projection). ``attn`` is the attention implementation; ``causal``
    says whether the config makes the model causal. Override ``load_weights`` for other
    weight layouts and ``position_embeddings`` for a rotary model's identity.
    """

    framework = "hf"
    array_library = "torch"
    kv_source = "self"  # query, key and value are the model's one input
    attn = "sdpa"
    causal = True
    attention = "layers.0.self_attn"
    layers: Dict[str, Optional[str]] = {"q": "q_proj", "k": "k_proj", "v": "v_proj",
                                        "o": "o_proj"}
    rotary = False  # True: the layer takes ``position_embeddings`` (cos, sin)
    window = False  # True: the config has a ``sliding_window`` this name sets
    # The attention implementations the model supports (keys of ATTN_IMPLEMENTATIONS).
    attns: Tuple[str, ...] = ("eager", "sdpa", "flex")
    # steps: generation with the library's own caches (a decoder's; the flex names leave it
    # out: FlexAttention compiles anew for every chunk's shape)
    # packed: sequences back to back, as padding-free training hands them over (position_ids
    # restarting at each sequence, no attention_mask, no cache: the causal masks find the
    # sequences from the positions)
    features = frozenset({"valid_lens", "causal", "steps", "static_cache", "packed",
                          "dropout"})
    # What a model takes: its 2-D attention_mask (B, S) beside its own causality, or nothing.
    mask_forms = frozenset({"causal_flag", "causal_flag+kpm_bool"})

    def dtypes(self, device: str):
        # The flex path runs FlexAttention, whose CPU lowering takes float32, float16 and
        # bfloat16 only (torch.flex's dtypes; in float64 every call raised inductor's
        # LoweringException after seconds of tracing, measured torch 2.13).
        out = list(super().dtypes(device))
        if self.attn == "flex" and device == "cpu":
            out.remove("float64")
        return out

    def framework_version(self) -> str:
        return transformers.__version__

    def config(self, problem: Problem) -> Any:
        """The model's config for ``problem`` (its sizes, one layer, no dropout but the
        attention's in training mode: ``attention_dropout(problem)``)."""
        raise NotImplementedError

    def sliding_window(self, problem: Problem) -> int:
        """The config's window: left + 1 of a ``local_window+causal_flag`` form, else L."""
        form = adapters.requested_form(problem)
        if form and "local_window" in adapters.form_parts(form):
            left, _ = adapters.form_mask(problem).window
            return left + 1
        return problem.L

    def build(self, p: Problem) -> torch.nn.Module:
        config = self.config(p)
        check_config_dropout(config, p)
        model = transformers.AutoModel.from_config(
            config, attn_implementation=ATTN_IMPLEMENTATIONS[self.attn])
        if self.layers.get("o") is None:  # the canonical output projection, after the layer
            model.out_linear = torch.nn.Linear(p.E, p.E, bias=True)
        return model.double()  # float64 before the canonical weights go in (no rounding)

    def first_attention(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.get_submodule(self.attention)

    def load_weights(self, model: torch.nn.Module, p: Problem) -> None:
        layer = self.first_attention(model)
        for role, param in adapters.to_linear(p.weights).items():
            name = self.layers.get(role)
            target = model.out_linear if name is None else layer.get_submodule(name)
            load_param(target, param)
        self.load_variants(model, p)

    def load_variants(self, model: torch.nn.Module, p: Problem) -> None:
        """Put the problem's score variants the layer holds as parameters (a model's sinks)
        into it; nothing by default (a config carries the rest)."""

    def read_weights(self, model: torch.nn.Module) -> Dict[str, np.ndarray]:
        """The weights the first attention layer holds (``layers`` are paths in it; the added
        output projection where it has none), under canonical names (the inverse of
        ``load_weights``, read by the wrapper checks)."""
        if type(self).load_weights is not HFModelCore.load_weights:
            raise Unsupported("load_weights is the wrapper's own (another weight layout) and "
                              "it gives no read_weights (its inverse)")
        layer = self.first_attention(model)
        per_role = {}
        for role in adapters.ROLES:
            name = self.layers.get(role)
            t = model.out_linear if name is None else layer.get_submodule(name)
            per_role[role] = adapters.Param(
                t.weight.detach().double().cpu().numpy().T,
                None if t.bias is None else t.bias.detach().double().cpu().numpy())
        return adapters.grads_from_conv1d(per_role)

    def position_embeddings(self, query: torch.Tensor, p: Problem) -> Tuple[torch.Tensor, ...]:
        """Identity rotary embeddings (cos = 1, sin = 0), (B, L, D): no positional encoding."""
        cos = torch.ones(*query.shape[:2], p.D, device=query.device, dtype=query.dtype)
        return cos, torch.zeros_like(cos)

    def prepare(self, problem, device, dtype, *, need_weights=False, grad=False):
        p = problem
        if not (p.query is p.key is p.value or (np.array_equal(p.query, p.key, equal_nan=True)
                                                and np.array_equal(p.key, p.value, equal_nan=True))):
            raise Unsupported("a model attends its own hidden states: query, key and value "
                              "must be the same array")
        m = p.mask
        if m.bias is not None:
            raise Unsupported("a model builds its mask from a 2-D attention_mask: no bias")
        form = adapters.requested_form(p)
        if m.allowed is not None and not (self.window and form == "local_window+causal_flag"):
            raise Unsupported("a model builds its mask from a 2-D attention_mask: no boolean "
                              "mask beside it")
        if m.valid_lens is not None and np.ndim(m.valid_lens) != 1:
            raise Unsupported("a model's 2-D attention_mask masks keys (B, S): per-query key "
                              "lengths (B, L) have no place in it")
        if bool(m.causal) != self.causal:
            raise Unsupported(f"the model is {'causal' if self.causal else 'not causal'} "
                              f"(its config), the problem {'is' if m.causal else 'is not'}")
        if m.segments is not None and not self.causal:
            raise Unsupported("transformers finds packed sequences from position_ids in its "
                              "causal masks only (an encoder's bidirectional mask has none)")
        if m.causal and m.causal_align != "top_left" and p.L != p.S:
            raise Unsupported("a model's causal mask is top left")
        w = p.weights
        if self.switches_biases() and \
                len({w.b_q is None, w.b_k is None, w.b_v is None, w.b_o is None}) > 1:
            raise Unsupported("the config switches the q, k, v and o biases together")
        state = super().prepare(p, device, dtype, need_weights=need_weights, grad=grad)
        return self.seed_dropout(state, p)

    def switches_biases(self) -> bool:
        """Whether the config's one option (``attention_bias``) adds all four biases or none."""
        return False

    def module_mask(self, problem: Problem, device: torch.device, dtype: torch.dtype
                    ) -> Dict[str, Any]:
        """The model's own input: a 2-D attention_mask (B, S) of ones and zeros, or none; a
        packed row as padding-free training hands it over (positions restarting at each
        sequence, no mask, no cache)."""
        if problem.mask.segments is not None:
            positions = segment_positions(problem.mask.segments)  # (B, L)
            return {"attention_mask": None, "problem": problem, "use_cache": False,
                    "position_ids": torch.as_tensor(positions, device=device)}
        if adapters.requested_form(problem):  # the form's (B, S) key padding, True = attend
            keep = adapters.form_mask(problem).key_padding
        else:
            lens = problem.mask.valid_lens
            keep = None if lens is None else np.arange(problem.S)[None, :] < np.asarray(
                lens)[:, None]  # (B, S)
        if keep is None:
            return {"attention_mask": None, "problem": problem}
        return {"attention_mask": torch.as_tensor(keep.astype(np.int64), device=device),
                "problem": problem}

    def layer_inputs(self, args: tuple, kwargs: Dict[str, Any], query: torch.Tensor,
                     p: Problem) -> Tuple[tuple, Dict[str, Any]]:
        """The first attention layer's arguments with the problem's query as its hidden
        states (and identity rotary embeddings for ``rotary``)."""
        if args:
            args = (query, *args[1:])
        else:
            kwargs = {**kwargs, "hidden_states": query}
        if self.rotary:
            kwargs = {**kwargs, "position_embeddings": self.position_embeddings(query, p)}
        return args, kwargs

    def call_in_steps(self, model, query, mask, p):
        """A prefill and decode steps against the library's cache (``generate``): the model
        builds each chunk's mask itself from its 2-D ``attention_mask``."""
        return self.generate(model, query, mask["attention_mask"], p)

    def call(self, model, query, key, value, mask, need_weights):
        p = mask["problem"]
        extra = {k: mask[k] for k in ("position_ids", "use_cache") if k in mask}
        return self.first_layer(model, query, p, need_weights,
                                attention_mask=mask["attention_mask"], **extra)

    def new_cache(self, model: torch.nn.Module, p: Problem) -> Any:
        """The library's own cache for a generation problem: a ``StaticCache`` of
        ``p.cache_len`` slots, else a ``DynamicCache`` (built from the config, so a
        sliding-window layer gets the library's sliding cache)."""
        if p.cache_len is not None:
            return transformers.StaticCache(config=model.config, max_cache_len=p.cache_len)
        return transformers.DynamicCache(config=model.config)

    def generate(self, model: torch.nn.Module, query: torch.Tensor, attention_mask: Any,
                 p: Problem) -> torch.Tensor:
        """The first attention layer's output, chunk by chunk (``p.steps``) as generation
        runs it: each chunk goes in alone with the cache the chunks before filled
        (``past_key_values``) and its positions (``cache_position``)."""
        cache, outs, start = self.new_cache(model, p), [], 0
        for n in p.steps:
            end = start + n
            kwargs = {"past_key_values": cache, "use_cache": True,
                      "cache_position": torch.arange(start, end, device=query.device)}
            if attention_mask is not None:
                kwargs["attention_mask"] = attention_mask[:, :end]
            # each step's tokens as generation hands them over: a tensor of their own
            out, _ = self.first_layer(model, query[:, start:end].contiguous(), p, False,
                                      **kwargs)
            outs.append(out)
            start = end
        return torch.cat(outs, dim=1)

    def first_layer(self, model: torch.nn.Module, query: torch.Tensor, p: Problem,
                    need_weights: bool, **model_kwargs: Any):
        """Run ``model`` with ``query`` fed to its first attention layer (the pre-hook) and
        stop at that layer's output: (output, weights or None)."""
        captured: Dict[str, Any] = {}
        layer = self.first_attention(model)

        def feed(module, args, kwargs):  # the problem's query as the layer's hidden states
            return self.layer_inputs(args, kwargs, query, p)

        def take(module, args, output):
            captured["out"] = output
            raise _Stop

        hooks = [layer.register_forward_pre_hook(feed, with_kwargs=True),
                 layer.register_forward_hook(take)]
        try:
            model(inputs_embeds=query, **model_kwargs)
        except _Stop:
            pass
        finally:
            for h in hooks:
                h.remove()
        out, weights = captured["out"][0], captured["out"][1]
        if self.layers.get("o") is None:
            out = model.out_linear(out)
        return out, weights if need_weights else None


def load_param(layer: torch.nn.Module, param: adapters.Param) -> None:
    """Copy an ``nn.Linear``-layout weight and its bias (zeros when the problem has none but
    the layer has one)."""
    layer.weight.copy_(torch.as_tensor(param.weight))
    if layer.bias is not None:
        layer.bias.copy_(torch.as_tensor(param.bias) if param.bias is not None
                         else torch.zeros_like(layer.bias))
    elif param.bias is not None:
        raise Unsupported(f"{type(layer).__name__} has no bias, the problem has one")


def _small(p: Problem) -> Dict[str, Any]:
    """Config entries every model here shares: one layer, a tiny vocabulary and MLP."""
    return {"num_hidden_layers": 1, "vocab_size": 8, "intermediate_size": 2 * p.E}


def _even_head_width(p: Problem) -> None:
    """A rotary config's validation refuses an odd head width: unsupported, in one line."""
    if p.D % 2:
        raise Unsupported(f"a rotary model needs an even head width, got D={p.D}")


class HFModelLlama(HFModelCore):
    """``LlamaModel``: ``create_causal_mask``, GQA, rotary (identity here)."""

    features = HFModelCore.features | {"gqa"}
    rotary = True

    def switches_biases(self) -> bool:
        return True

    def config(self, p):
        _even_head_width(p)
        return transformers.LlamaConfig(
            hidden_size=p.E, num_attention_heads=p.H, num_key_value_heads=p.K, head_dim=p.D,
            attention_bias=p.weights.b_q is not None, attention_dropout=attention_dropout(p),
            **_small(p))


class HFModelMistral(HFModelLlama):
    """``MistralModel``: ``create_sliding_window_causal_mask`` with the config's
    ``sliding_window`` (no ``attention_bias`` option: a bias-free model)."""

    window = True
    projection_bias = False
    # The window form's problem carries the window as its boolean mask (refused otherwise).
    features = HFModelLlama.features | {"bool_mask"}
    mask_forms = HFModelLlama.mask_forms | {"local_window+causal_flag"}

    def switches_biases(self) -> bool:
        return False

    def config(self, p):
        _even_head_width(p)
        return transformers.MistralConfig(
            hidden_size=p.E, num_attention_heads=p.H, num_key_value_heads=p.K, head_dim=p.D,
            sliding_window=self.sliding_window(p), attention_dropout=attention_dropout(p),
            **_small(p))


class HFModelGemma2(HFModelLlama):
    """``Gemma2Model``: soft-caps its attention logits (``attn_logit_softcapping``: the
    problem's cap, none without one), scales by ``query_pre_attn_scalar ** -0.5`` (the
    problem's scale), one sliding-window layer (``create_sliding_window_causal_mask``),
    GQA, rotary (identity here). Its config refuses sdpa (no soft-capping there)."""

    window = True
    attns = ("eager", "flex")
    features = HFModelLlama.features | {"bool_mask", "softcap", "scale"}
    mask_forms = HFModelLlama.mask_forms | {"local_window+causal_flag"}

    def config(self, p):
        _even_head_width(p)
        scale = p.effective_scale
        n = round(scale ** -2) if scale > 0 else 0
        if n < 1 or not np.isclose(n ** -0.5, scale, rtol=1e-12, atol=0):
            raise Unsupported(f"the model scales by query_pre_attn_scalar ** -0.5 (an int in "
                              f"its config), the problem by {scale}")
        return transformers.Gemma2Config(
            hidden_size=p.E, num_attention_heads=p.H, num_key_value_heads=p.K, head_dim=p.D,
            query_pre_attn_scalar=n, attn_logit_softcapping=p.softcap,
            final_logit_softcapping=None, sliding_window=self.sliding_window(p),
            layer_types=["sliding_attention"], attention_bias=p.weights.b_q is not None,
            attention_dropout=attention_dropout(p), **_small(p))


class HFModelGptOss(HFModelLlama):
    """``GptOssModel``: a learned sink per head (``sinks``: the problem's, or -inf, whose
    exp is 0, without one) joins its softmax's denominator, one sliding-window layer
    (``create_sliding_window_causal_mask``), GQA, rotary on half-width cos/sin (identity
    here). Its flex path refuses sinks on a CPU (transformers raises); it has no sdpa."""

    window = True
    attns = ("eager", "flex")
    features = HFModelLlama.features | {"bool_mask", "sinks"}
    mask_forms = HFModelLlama.mask_forms | {"local_window+causal_flag"}

    def config(self, p):
        _even_head_width(p)
        return transformers.GptOssConfig(
            hidden_size=p.E, num_attention_heads=p.H, num_key_value_heads=p.K, head_dim=p.D,
            sliding_window=self.sliding_window(p), layer_types=["sliding_attention"],
            attention_bias=p.weights.b_q is not None, attention_dropout=attention_dropout(p),
            num_local_experts=2, num_experts_per_tok=1, **_small(p))

    def call(self, model, query, key, value, mask, need_weights):
        try:
            return super().call(model, query, key, value, mask, need_weights)
        except ValueError as exc:  # the flex path refuses sinks on a CPU (transformers 5.x)
            if "sinks" in str(exc) and "CPU" in str(exc):
                raise Unsupported(f"transformers refuses: {exc}") from exc
            raise

    def load_variants(self, model, p):
        sinks = np.full(p.H, -np.inf) if p.sinks is None else np.asarray(p.sinks, np.float64)
        self.first_attention(model).sinks.copy_(torch.as_tensor(sinks))

    def position_embeddings(self, query, p):
        """Identity rotary on half the head width (its ``_apply_rotary_emb`` splits the head
        in two halves, each multiplied by cos (B, L, D/2))."""
        cos = torch.ones(*query.shape[:2], p.D // 2, device=query.device, dtype=query.dtype)
        return cos, torch.zeros_like(cos)


class HFModelBloom(HFModelCore):
    """``BloomModel``: ALiBi always on, its own slopes (``build_alibi_tensor``: each head's
    slope times the key's position among the unpadded keys), fixed scale 1/sqrt(D), q/k/v
    fused per head (``query_key_value``: (H, 3, D) rows), the residual added inside the
    attention layer (zeroed here, so the layer's output is the attention's), causal, its
    softmax in float32. The model cannot leave ALiBi out nor take other slopes: it runs the
    problems whose ALiBi is its own (slopes ``alibi_slopes(H)``, by key position or by the
    signed distance, which softmax cannot tell apart), and no other."""

    attention = "h.0.self_attention"
    layers = {"q": None, "k": None, "v": None, "o": "dense"}
    attns = ("eager",)  # BloomModel has its own attention code only
    # Not packed: BloomModel.forward takes no position_ids (its ALiBi counts positions from
    # the 2-D attention_mask), so sequences back to back in one row attend each other.
    features = (HFModelCore.features - {"packed"}) | {"alibi"}

    def config(self, p):
        return transformers.BloomConfig(hidden_size=p.E, n_head=p.H, n_layer=1, vocab_size=8,
                                        attention_dropout=attention_dropout(p),
                                        hidden_dropout=0.0)

    def prepare(self, problem, device, dtype, *, need_weights=False, grad=False):
        a = problem.alibi
        if a is None:
            raise Unsupported("BLOOM always adds ALiBi (its own slopes); the problem has none")
        if a.convention not in ("key", "signed"):
            raise Unsupported(f"BLOOM's ALiBi is by key position, the problem's by "
                              f"{a.convention}")
        if not np.array_equal(np.asarray(a.slopes), alibi_slopes(problem.H)):
            raise Unsupported("BLOOM's ALiBi slopes are its own (alibi_slopes(H)); the "
                              "problem's are others")
        return super().prepare(problem, device, dtype, need_weights=need_weights, grad=grad)

    def load_weights(self, model, p):
        layer = self.first_attention(model)
        w, H, D, E = p.weights, p.H, p.D, p.E
        fused = np.stack([m.reshape(E, H, D) for m in (w.w_q, w.w_k, w.w_v)], axis=2)
        layer.query_key_value.weight.copy_(torch.as_tensor(fused.reshape(E, 3 * E).T))
        bias = (np.zeros(3 * E) if w.b_q is None else
                np.stack([b.reshape(H, D) for b in (w.b_q, w.b_k, w.b_v)], axis=1).ravel())
        layer.query_key_value.bias.copy_(torch.as_tensor(bias))
        load_param(layer.dense, adapters.to_linear(w)["o"])

    def layer_inputs(self, args, kwargs, query, p):
        """The query as hidden states and a zero residual (the block's own is its input)."""
        args, kwargs = super().layer_inputs(args, kwargs, query, p)
        if len(args) > 1:
            args = (args[0], torch.zeros_like(query), *args[2:])
        else:
            kwargs = {**kwargs, "residual": torch.zeros_like(query)}
        return args, kwargs


class HFModelGPT2(HFModelCore):
    """``GPT2Model``: packed ``Conv1D`` q/k/v ``c_attn`` (E, 3E), ``c_proj``; causal."""

    attention = "h.0.attn"
    attns = ("eager", "sdpa")  # GPT2Model refuses flex_attention

    def config(self, p):
        return transformers.GPT2Config(n_embd=p.E, n_head=p.H, n_layer=1, vocab_size=8,
                                       attn_pdrop=attention_dropout(p), resid_pdrop=0.0,
                                       embd_pdrop=0.0,
                                       bos_token_id=0, eos_token_id=0,
                                       n_positions=max(1024, p.L))  # a position per query

    def load_weights(self, model, p):
        layer = self.first_attention(model)
        packed = adapters.to_conv1d_packed(p.weights)  # c_attn (E, 3E), c_proj (E, E)
        for name in ("c_attn", "c_proj"):
            _load_conv1d(getattr(layer, name), packed[name])


def _load_conv1d(layer: torch.nn.Module, param: adapters.Param) -> None:
    layer.weight.copy_(torch.as_tensor(param.weight))  # Conv1D (in, out)
    layer.bias.copy_(torch.as_tensor(param.bias) if param.bias is not None
                     else torch.zeros_like(layer.bias))


class HFModelBert(HFModelCore):
    """``BertModel`` as an encoder (``create_bidirectional_mask``: padding only, not causal);
    the output projection sits outside the self-attention layer (a plain linear here)."""

    causal = False
    mask_forms = frozenset({"kpm_bool"})
    attention = "encoder.layer.0.attention.self"
    layers = {"q": "query", "k": "key", "v": "value", "o": None}

    def config(self, p):
        return transformers.BertConfig(hidden_size=p.E, num_attention_heads=p.H,
                                       attention_probs_dropout_prob=attention_dropout(p),
                                       hidden_dropout_prob=0.0, is_decoder=self.causal,
                                       max_position_embeddings=max(512, p.L),
                                       **_small(p))


class HFModelBertDecoder(HFModelBert):
    """``BertModel`` with ``is_decoder=True``: its causal mask (``create_causal_mask``)."""

    causal = True
    mask_forms = HFModelCore.mask_forms


_MODELS = {"llama": HFModelLlama, "mistral": HFModelMistral, "gemma2": HFModelGemma2,
           "gpt_oss": HFModelGptOss, "bloom": HFModelBloom, "gpt2": HFModelGPT2,
           "bert": HFModelBert,
           "bert_decoder": HFModelBertDecoder}
_VERSIONS = f"transformers {transformers.__version__}, torch {torch.__version__}"
# The whole model's attention paths behave as the single layers' (hf_transformers): measured
# here once the square self-attention forms reached their padding and NaN cases.
_NAN_PADDING = Deviation(
    "confined", "NaN in a masked key or value position gives NaN rows: the model's mask is "
                "added to q.k^T (NaN + finfo.min is NaN) and 0 * NaN is NaN in weights @ v "
                f"(measured, {_VERSIONS})")
DEVIATIONS: Dict[str, Dict[str, Deviation]] = {
    "eager": {
        "fully_masked_rows": Deviation(
            "mean_values", "a query row with no key to attend gives the mean of the values: "
                           "the model's eager mask fills masked logits with finfo(dtype).min, "
                           f"not -inf, so the row's softmax is uniform (measured, {_VERSIONS})"),
        "nan_padding": _NAN_PADDING},
    "sdpa": {"nan_padding": _NAN_PADDING},
    "flex": {"nan_padding": _NAN_PADDING},
}
# The models whose eager attention runs the softmax in float32 whatever the input dtype
# (``softmax(..., dtype=torch.float32).to(query.dtype)``: Llama, Mistral and Gemma 2's
# eager_attention_forward, BloomAttention); GPT-2, gpt-oss and BERT keep the input dtype.
FLOAT32_SOFTMAX = frozenset({"llama", "mistral", "gemma2", "bloom"})


def deviations_of(model: str, attn: str, table: Dict[str, Dict[str, Deviation]],
                  versions: str) -> Dict[str, object]:
    """``table[attn]``; for the eager path of a model whose float64 softmax runs in float32
    (``FLOAT32_SOFTMAX``) also the float64_softmax policy, and in float64 the rows with no key
    NaN (the mask's finfo(float64).min fill becomes -inf when cast to float32) where the other
    dtypes give the mean of the values."""
    eager = table[attn]
    if attn != "eager" or model not in FLOAT32_SOFTMAX:
        return eager
    mean = eager["fully_masked_rows"]
    return {**eager,
            "float64_softmax": Deviation(
                "float32", "the eager softmax runs in float32 for float64 inputs "
                           "(softmax(..., dtype=torch.float32).to(query.dtype); measured, "
                           f"{versions})"),
            "fully_masked_rows": {
                **{dtype: mean for dtype in ("float32", "float16", "bfloat16")},
                "float64": Deviation(
                    "nan", "in float64 a query row with no key to attend gives NaN: the mask's "
                           "finfo(float64).min fill becomes -inf when the logits are cast to "
                           f"float32 for the softmax (measured, {versions})")}}


def _paths(attn: str, base: type) -> Tuple[Contract, ...]:
    """A path other than eager agrees with the model's eager path (suite.conformance.families.contracts)."""
    if attn == "eager" or "eager" not in base.attns:
        return ()
    return (Contract("agrees_with_eager", "agrees", {"attn": "eager"},
                     f"the model's {attn} attention computes what its eager attention does"),)


def variants() -> List[type]:
    """One class per model and attention implementation the model supports:
    ``hf.model.MODEL[eager|sdpa|flex]``."""
    out = []
    for model, base in _MODELS.items():
        for attn in base.attns:
            features = base.features | ({"weights"} if attn == "eager" else set())
            if attn == "flex":
                # transformers' flex_attention_forward raises for any dropout above 0
                features = features - {"steps", "static_cache", "dropout"}
            out.append(type(f"HFModel_{model}_{attn}", (base,), {
                "name": f"hf.model.{model}[{attn}]", "attn": attn,
                "features": frozenset(features),
                "deviations": deviations_of(model, attn, DEVIATIONS, _VERSIONS),
                # FlexAttention compiles anew for each shape and mask (seconds each).
                "compiles_per_shape": attn == "flex", "__module__": __name__,
                # the models share transformers' flex_attention integration and its compile
                "compile_path": "transformers flex_attention" if attn == "flex" else None,
                "contracts": _paths(attn, base)}))
    return out
