"""Hugging Face transformers models on opforge's fused ops: ``opforge.patch(model)``.

For Llama, Mistral, Qwen2, Qwen3, Gemma and Gemma2 models (transformers >= 5.0) the patch
reroutes, in place on the model instance:

* every RMSNorm module (the decoder layers' norms, Qwen3's q_norm / k_norm, the final norm) to
  ``opforge.rmsnorm``, or ``opforge.gemma_rmsnorm`` for the Gemma families, whose norms apply
  ``(1 + weight)``;
* each decoder layer's residual add and the norm that follows it to one ``fused_add_rmsnorm``
  call (Gemma2, whose post_attention_layernorm runs on the attention output before the add:
  the add with pre_feedforward_layernorm);
* each MLP's gate_proj and up_proj to one merged ``gate_up_proj`` Linear (weights ``[gate; up]``)
  whose output feeds the gated activation op (``silu_and_mul``, ``gelu_tanh_and_mul`` or
  ``gelu_and_mul``, from the config's activation).

Each patched module keeps its identity and gets a subclass of its own class as its class
(``OpforgeLlamaRMSNorm`` ...): isinstance checks, the forward hooks transformers puts on decoder
layers to record ``output_hidden_states``, and every parameter name except gate/up stay valid.

Numerics: opforge computes each norm and activation in fp32 and rounds once. transformers' Llama
style RMSNorm rounds the normalised value before multiplying by the weight, and its MLP rounds
between activation and product, so patched results agree with the original within the dtype's
rounding, not bitwise (Gemma's norm rounds once, like opforge).

Why transformers >= 5.0: from 5.0 on every supported decoder layer returns a plain tensor and
forwards all its arguments to self_attn, which is what the patched layers reproduce (Gemma2's
layer still returned a tuple in 4.57).
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn

import opforge

MIN_TRANSFORMERS = (5, 0)

SUPPORTED = (
    "Llama, Mistral, Qwen2, Qwen3, Gemma and Gemma2 (config.model_type llama, mistral, qwen2, qwen3, "
    "gemma, gemma2), as a *ForCausalLM or the bare *Model"
)


@dataclass(frozen=True)
class _Family:
    prefix: str  # class-name prefix in transformers.models.<model_type>.modeling_<model_type>
    gemma: bool  # RMSNorm applies (1 + weight) and keeps eps in `eps` (else `variance_epsilon`)
    act_attr: str  # the config attribute the family's MLP builds its activation from
    sandwich: bool = False  # Gemma2: extra norms on the attention and MLP outputs


FAMILIES = {
    "llama": _Family("Llama", False, "hidden_act"),
    "mistral": _Family("Mistral", False, "hidden_act"),
    "qwen2": _Family("Qwen2", False, "hidden_act"),
    "qwen3": _Family("Qwen3", False, "hidden_act"),
    "gemma": _Family("Gemma", True, "hidden_act"),
    "gemma2": _Family("Gemma2", True, "hidden_activation", sandwich=True),
}

#: transformers activation name -> the opforge gated op computing the same function.
ACTIVATIONS = {
    "silu": "silu_and_mul",
    "swish": "silu_and_mul",
    "gelu_pytorch_tanh": "gelu_tanh_and_mul",
    "gelu_new": "gelu_tanh_and_mul",
    "gelu": "gelu_and_mul",
}


# --- what patched modules run --------------------------------------------------------------
# The ops are looked up on the opforge module at call time, so wrapping them (logging,
# counting) reaches patched models too; torch.compile sees the registered custom ops.


class _Patched:
    """Marks a module whose forward runs through opforge; patch() skips it (idempotence)."""


class _RMSNorm(_Patched):
    """Llama-style RMSNorm (eps in ``variance_epsilon``) through opforge."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return opforge.rmsnorm(hidden_states, self.weight, self.variance_epsilon)

    def add_norm_(self, hidden_states: torch.Tensor, residual: torch.Tensor):
        """``(norm(hidden_states + residual), hidden_states + residual)``; the first is written
        over ``hidden_states``, the sum goes to a new tensor."""
        return opforge.fused_add_rmsnorm(hidden_states, residual, self.weight, self.variance_epsilon,
                                         out=hidden_states)


class _GemmaRMSNorm(_Patched):
    """Gemma's RMSNorm (weight applied as 1 + w, eps in ``eps``) through opforge."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return opforge.gemma_rmsnorm(hidden_states, self.weight, self.eps)

    def norm_(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return opforge.gemma_rmsnorm(hidden_states, self.weight, self.eps, out=hidden_states)

    def add_norm_(self, hidden_states: torch.Tensor, residual: torch.Tensor):
        return opforge.gemma_fused_add_rmsnorm(hidden_states, residual, self.weight, self.eps,
                                               out=hidden_states)


class _GatedMLP(_Patched):
    """down_proj(act(gate) * up) with gate and up from one merged projection."""

    _opforge_act = ""  # the opforge op's name, set per patched class

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(getattr(opforge, self._opforge_act)(self.gate_up_proj(x)))


class _Layer(_Patched):
    """A decoder layer with the residual adds fused into the norms.

    In place, and why: the attention and MLP outputs are fresh projection outputs owned by this
    layer, so the norms and the final residual add write over them. The layer's input
    ``hidden_states`` is never written: the caller still holds it (it is the previous layer's
    output, which output_hidden_states collects), so the first residual sum goes to a new tensor.
    The end-of-layer add is not fused with the next layer's input norm: that would mean passing
    (hidden, residual) pairs between layers, i.e. replacing the model's own forward and the
    hidden states it records.
    """

    # The original forward's positional parameters after hidden_states, and its defaults: the
    # original passes every argument on to self_attn, defaults included, and so does this.
    _opforge_positional: tuple = ()
    _opforge_defaults: dict = {}

    def _attn_kwargs(self, args: tuple, kwargs: dict) -> dict:
        if args:
            if len(args) > len(self._opforge_positional):
                raise TypeError(f"{type(self).__name__}.forward() takes {len(self._opforge_positional) + 1} "
                                f"positional arguments after self, got {len(args) + 1}")
            for name, value in zip(self._opforge_positional, args):
                if name in kwargs:
                    raise TypeError(f"{type(self).__name__}.forward() got multiple values for argument {name!r}")
                kwargs[name] = value
        return {**self._opforge_defaults, **kwargs}


class _PreNormLayer(_Layer):
    """Llama, Mistral, Qwen2, Qwen3, Gemma: x + attn(norm(x)), then + mlp(norm(.))."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        kwargs = self._attn_kwargs(args, kwargs)
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        hidden_states, residual = self.post_attention_layernorm.add_norm_(hidden_states, residual)
        return self.mlp(hidden_states).add_(residual)


class _SandwichLayer(_Layer):
    """Gemma2: x + post_norm(attn(norm(x))), then + post_ff_norm(mlp(pre_ff_norm(.)))."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        kwargs = self._attn_kwargs(args, kwargs)
        residual = hidden_states
        hidden_states, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
        hidden_states = self.post_attention_layernorm.norm_(hidden_states)
        hidden_states, residual = self.pre_feedforward_layernorm.add_norm_(hidden_states, residual)
        return self.post_feedforward_layernorm.norm_(self.mlp(hidden_states)).add_(residual)


def _layer_signature(cls: type) -> tuple[tuple, dict]:
    params = list(inspect.signature(cls.forward).parameters.values())[2:]  # self, hidden_states
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    positional = tuple(p.name for p in params if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD)
    defaults = {p.name: p.default for p in params if p.kind in kinds and p.default is not inspect.Parameter.empty}
    return positional, defaults


@functools.lru_cache(maxsize=None)
def _patched_class(base: type, mixin: type, act: str = "") -> type:
    """The subclass of ``base`` a patched module gets (one per base class and activation)."""
    name = f"Opforge{base.__name__}"
    attrs = {"__module__": __name__, "__qualname__": name, "__doc__": f"{base.__name__} through opforge's ops."}
    if act:
        attrs["_opforge_act"] = act
    if issubclass(mixin, _Layer):
        attrs["_opforge_positional"], attrs["_opforge_defaults"] = _layer_signature(base)
    return type(name, (mixin, base), attrs)


# --- checks: everything is validated before anything changes --------------------------------


def _refuse(message: str) -> ValueError:
    return ValueError(f"opforge.patch: {message}; the model was not changed")


def _require_transformers() -> None:
    import transformers

    release = tuple(int(p) for p in transformers.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    if release < MIN_TRANSFORMERS:
        raise RuntimeError(f"opforge.patch needs transformers >= {'.'.join(map(str, MIN_TRANSFORMERS))}, "
                           f"found {transformers.__version__}; the model was not changed")


def _classes(model_type: str, family: _Family) -> SimpleNamespace:
    mod = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    names = ("PreTrainedModel", "Model", "DecoderLayer", "MLP", "RMSNorm")
    return SimpleNamespace(**{n: getattr(mod, family.prefix + n) for n in names})


def _activation(config, family: _Family, model_type: str) -> tuple[str, type]:
    """(opforge op name, the activation module class the MLPs must hold)."""
    from transformers.activations import ACT2FN

    name = getattr(config, family.act_attr, None)
    if name not in ACTIVATIONS:
        raise _refuse(f"{model_type} config has {family.act_attr}={name!r}, which has no fused opforge op; "
                      f"accepted: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name], type(ACT2FN[name])


def _mlp_problem(mlp: nn.Module, act_cls: type) -> str | None:
    gate, up = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
    if type(gate) is not nn.Linear or type(up) is not nn.Linear:
        return (f"gate_proj / up_proj are {type(gate).__name__} / {type(up).__name__}, not torch.nn.Linear "
                "(quantized or replaced projections cannot be merged)")
    if not isinstance(getattr(mlp, "down_proj", None), nn.Module):
        return "has no down_proj module"
    if (gate.in_features, gate.out_features) != (up.in_features, up.out_features):
        return f"gate_proj {tuple(gate.weight.shape)} and up_proj {tuple(up.weight.shape)} differ in shape"
    if gate.weight.dtype != up.weight.dtype or gate.weight.device != up.weight.device:
        return "gate_proj and up_proj differ in dtype or device"
    if (gate.bias is None) != (up.bias is None):
        return "only one of gate_proj and up_proj has a bias"
    if type(getattr(mlp, "act_fn", None)) is not act_cls:
        return f"act_fn is {type(getattr(mlp, 'act_fn', None)).__name__}, not the config's {act_cls.__name__}"
    return None


@dataclass
class _Plan:
    norms: list  # (module, patched class)
    mlps: list
    layers: list


def _plan(model) -> _Plan:
    if not isinstance(model, nn.Module):
        raise TypeError(f"opforge.patch: model must be a torch.nn.Module, got {type(model).__name__}")
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    family = FAMILIES.get(model_type)
    if family is None:
        raise _refuse(f"{type(model).__name__} (model_type {model_type!r}) is not supported; "
                      f"supported architectures: {SUPPORTED}")
    _require_transformers()
    cls = _classes(model_type, family)
    base = getattr(model, "base_model", model)
    if not isinstance(model, cls.PreTrainedModel) or not isinstance(base, cls.Model):
        raise _refuse(f"model_type {model_type!r} but {type(model).__name__} is not a transformers "
                      f"{family.prefix} model; supported architectures: {SUPPORTED}")
    act, act_cls = _activation(model.config, family, model_type)

    norm_mixin = _GemmaRMSNorm if family.gemma else _RMSNorm
    norm_cls = _patched_class(cls.RMSNorm, norm_mixin)
    mlp_cls = _patched_class(cls.MLP, _GatedMLP, act)
    layer_cls = _patched_class(cls.DecoderLayer, _SandwichLayer if family.sandwich else _PreNormLayer)
    layer_norms = ("input_layernorm", "post_attention_layernorm")
    if family.sandwich:
        layer_norms += ("pre_feedforward_layernorm", "post_feedforward_layernorm")

    problems, plan = [], _Plan([], [], [])
    if list(inspect.signature(cls.DecoderLayer.forward).parameters)[:2] != ["self", "hidden_states"]:
        problems.append(f"{cls.DecoderLayer.__name__}.forward does not start with (self, hidden_states) in this "
                        "transformers version")
    dtypes = {p.dtype for p in base.parameters() if p.is_floating_point()}
    if not dtypes <= {torch.float16, torch.bfloat16, torch.float32}:
        problems.append(f"parameters in {sorted(map(str, dtypes))}; opforge's ops take float16, bfloat16 or float32")

    def take(path: str, module: nn.Module, patched: type, todo: list) -> None:
        if isinstance(module, _Patched):
            return
        if "forward" in vars(module):
            problems.append(f"{path} has its forward replaced on the instance (accelerate hooks from "
                            "device_map offloading, or another patch)")
        else:
            todo.append((module, patched))

    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise _refuse(f"{type(base).__name__} has no decoder layers (.layers)")
    for i, layer in enumerate(layers):
        path = f"layers.{i}"
        if type(layer) not in (cls.DecoderLayer, layer_cls):
            problems.append(f"{path} is {type(layer).__name__}, not {cls.DecoderLayer.__name__}")
            continue
        for name in layer_norms:
            if type(getattr(layer, name, None)) not in (cls.RMSNorm, norm_cls):
                problems.append(f"{path}.{name} is {type(getattr(layer, name, None)).__name__}, "
                                f"not {cls.RMSNorm.__name__}")
        mlp = getattr(layer, "mlp", None)
        if type(mlp) is cls.MLP:
            problem = _mlp_problem(mlp, act_cls)
            if problem:
                problems.append(f"{path}.mlp {problem}")
            else:
                take(f"{path}.mlp", mlp, mlp_cls, plan.mlps)
        elif type(mlp) is not mlp_cls:
            problems.append(f"{path}.mlp is {type(mlp).__name__}, not {cls.MLP.__name__}")
        take(path, layer, layer_cls, plan.layers)
    for name, module in base.named_modules():
        if type(module) is cls.RMSNorm:
            take(name, module, norm_cls, plan.norms)
    if problems:
        shown = "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")
        raise _refuse(f"{type(model).__name__} cannot be patched: {shown}")
    return plan


# --- the patch --------------------------------------------------------------------------------


def _merge_gate_up(mlp: nn.Module) -> None:
    """Replace gate_proj and up_proj with one Linear holding [gate; up], and drop the old ones."""
    gate, up = mlp.gate_proj, mlp.up_proj
    bias = gate.bias is not None
    # Built on the meta device: its parameters are replaced below, so nothing is initialised.
    merged = nn.Linear(gate.in_features, gate.out_features + up.out_features, bias=bias, device="meta")
    with torch.no_grad():
        merged.weight = nn.Parameter(torch.cat([gate.weight, up.weight]), requires_grad=gate.weight.requires_grad)
        if bias:
            merged.bias = nn.Parameter(torch.cat([gate.bias, up.bias]), requires_grad=gate.bias.requires_grad)
    del mlp.gate_proj, mlp.up_proj
    mlp.gate_up_proj = merged


def patch(model):
    """Run a transformers Llama, Mistral, Qwen2, Qwen3, Gemma or Gemma2 model on opforge's fused
    ops, in place; returns the model::

        opforge.patch(model)

    ``model``: a ``*ForCausalLM`` or the bare ``*Model`` of those families (transformers >= 5.0).
    Every RMSNorm runs ``opforge.rmsnorm`` (Gemma families: ``gemma_rmsnorm``), each decoder
    layer's residual add and following norm run as one ``fused_add_rmsnorm``, and each MLP's
    gate_proj and up_proj become one merged ``gate_up_proj`` Linear feeding ``silu_and_mul`` /
    ``gelu_tanh_and_mul`` / ``gelu_and_mul`` (the old gate/up parameters are freed). Works with
    ``model.generate()``, static caches, torch.compile and CUDA graphs.

    The patched model is for inference: opforge's ops have no backward and refuse tensors that
    require grad while grad mode is on. ``generate()`` runs under no_grad; call the model itself
    under ``torch.no_grad()`` or ``torch.inference_mode()``. Run it in its own dtype (the ops
    take the norm weights and activations in one dtype; autocast is not supported). The merged
    projection renames the MLP's state_dict keys: save checkpoints from an unpatched model.

    Patching twice is a no-op. Any other model, an activation without a fused op, or modules that
    are not the family's own (quantized projections, instance-level forward hooks) raise
    ValueError, checked before anything changes, so a refused model is left as it was.
    """
    plan = _plan(model)
    for module, patched in plan.norms:
        module.__class__ = patched
    for mlp, patched in plan.mlps:
        _merge_gate_up(mlp)
        mlp.__class__ = patched
    for layer, patched in plan.layers:
        layer.__class__ = patched
    return model
