"""Holding a QuantWeight inside an nn.Module as buffers.

Why buffers: ``.to(device)``, ``state_dict`` / ``load_state_dict``, ``torch.compile`` and FSDP-style tooling all
see a module's tensors only through its parameters and buffers.  Why a dtype guard: ``model.to(torch.bfloat16)``
(or ``.half()``) casts every floating buffer, which would silently round fp32 scales / global scales to bf16 and
break the scheme's storage contract; quantized tensors therefore follow device moves but never dtype casts.

Why an extra state: the tensors alone do not say what their bits mean -- an mxfp4 state_dict has exactly the keys
and shapes of an mxint4 one.  Every module's state_dict therefore carries ``<module>._extra_state``: the scheme
string and logical shape of each of its QuantWeights as UTF-8 JSON in a uint8 tensor (a tensor, so it survives
``torch.load(weights_only=True)`` and safetensors alike).  ``load_state_dict`` of a state_dict made with another
scheme (or shape) is refused, naming both, before anything is copied; a state_dict without one (saved before the
scheme was recorded) loads with a warning that it could not be checked.
"""
from __future__ import annotations

import json
import warnings

import torch

from ..formats.scheme import QuantScheme
from ..formats.weight import QuantWeight
from ..ops import quant_weight_from_args

# QuantWeight field -> buffer-name suffix (the bias is registered by each module: it follows the model's dtype)
FIELDS = (("data", "packed"), ("scales", "scale"), ("zeros", "zero_point"), ("global_scale", "global_scale"),
          ("input_scale", "input_scale"))
_EXTRA_KEY = "_extra_state"  # torch's key for get_extra_state()
_FORMAT = 1


def _scheme_name(text: str) -> str:
    try:
        return QuantScheme.parse(text).name
    except ValueError:
        return text


def decode_extra_state(state) -> dict[str, dict]:
    """A QuantLinear / QuantMoE extra state (uint8 JSON tensor, or the decoded dict) -> {prefix: {"scheme",
    "shape"}}."""
    if isinstance(state, torch.Tensor):
        state = state.detach().cpu().to(torch.uint8).numpy().tobytes()
    if isinstance(state, (bytes, bytearray)):
        state = state.decode("utf-8")
    if isinstance(state, str):
        state = json.loads(state)
    if not isinstance(state, dict) or not isinstance(state.get("weights"), dict):
        raise ValueError(f"not a humming_triton module state: {str(state)[:80]!r}")
    return state["weights"]


class QuantBuffersMixin:
    """Registers QuantWeights under a name prefix and rebuilds them (cached) from the current buffers."""

    _dtype_frozen: tuple[str, ...] = ()

    def _register_quant_weight(self, prefix: str, qw: QuantWeight) -> None:
        names = []
        for field, suffix in FIELDS:
            name = f"{prefix}_{suffix}"
            self.register_buffer(name, getattr(qw, field))
            names.append(name)
        self.register_buffer(f"{prefix}_k_perm", getattr(qw, "k_perm", None))  # act-order (newer QuantWeights)
        self._dtype_frozen = (*self._dtype_frozen, *names)
        self._meta = {**getattr(self, "_meta", {}), prefix: (str(qw.scheme), list(qw.shape))}

    def _weight_args(self, prefix: str, bias: torch.Tensor | None) -> tuple:
        """The ops' positional weight arguments: data, scales, zeros, global, input scale, bias, k_perm, scheme,
        shape."""
        b = self._buffers
        scheme, shape = self._meta[prefix]
        return (*(b[f"{prefix}_{s}"] for _, s in FIELDS), bias, b[f"{prefix}_k_perm"], scheme, shape)

    def _quant_weight(self, prefix: str, bias: torch.Tensor | None = None) -> QuantWeight:
        return quant_weight_from_args(*self._weight_args(prefix, bias))

    # --- the scheme in the saved state (see the module docstring) ---------------------------------------------------
    def get_extra_state(self) -> torch.Tensor:
        weights = {p: {"scheme": scheme, "shape": list(shape)} for p, (scheme, shape) in self._meta.items()}
        blob = json.dumps({"humming_triton": _FORMAT, "weights": weights}, sort_keys=True).encode("utf-8")
        return torch.frombuffer(bytearray(blob), dtype=torch.uint8)

    def _state_mismatch(self, theirs: dict[str, dict], where: str = "") -> str | None:
        """Why a saved state of QuantWeights ``theirs`` cannot be loaded into this module (None if it can)."""
        ours = {p: {"scheme": scheme, "shape": list(shape)} for p, (scheme, shape) in self._meta.items()}
        for p in sorted(set(ours) | set(theirs)):
            a, b = theirs.get(p), ours.get(p)
            if a is None or b is None:
                return (f"{where}{p}: the state_dict holds quantized weights {sorted(theirs)} but this "
                        f"{type(self).__name__} has {sorted(ours)}")
            if a.get("scheme") != b["scheme"] or list(a.get("shape", [])) != b["shape"]:
                return (f"{where}{p}: the state_dict was saved with scheme {_scheme_name(str(a.get('scheme')))} "
                        f"{list(a.get('shape', []))} but this {type(self).__name__} is scheme "
                        f"{_scheme_name(b['scheme'])} {b['shape']}: its tensors would be read with the wrong "
                        f"meaning (build the module with scheme {_scheme_name(str(a.get('scheme')))} to load it)")
        return None

    def set_extra_state(self, state) -> None:
        why = self._state_mismatch(decode_extra_state(state))
        if why:
            raise ValueError(why)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        key = prefix + _EXTRA_KEY
        if key in state_dict:
            try:
                why = self._state_mismatch(decode_extra_state(state_dict[key]), prefix)
            except (ValueError, UnicodeDecodeError) as e:
                why = f"{key}: {e}"
            if why:  # refused before anything is copied into this module
                error_msgs.append(why)
                return
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if key not in state_dict:
            if key in missing_keys:
                missing_keys.remove(key)
            schemes = ", ".join(sorted({_scheme_name(scheme) for scheme, _ in self._meta.values()}))
            # no module name in the message: Python shows it once, not once per layer of a model
            warnings.warn(f"a state_dict without the scheme (saved before humming_triton recorded it) was loaded into "
                          f"{type(self).__name__} modules of scheme {schemes} unchecked", stacklevel=4)

    def _apply(self, fn, recurse=True):
        order = list(self._buffers)
        frozen = {n: self._buffers.pop(n) for n in self._dtype_frozen if n in self._buffers}
        try:
            result = super()._apply(fn, recurse)
        finally:
            for n, t in frozen.items():
                if t is not None:
                    moved = fn(t)
                    frozen[n] = moved if moved.dtype == t.dtype else t.to(device=moved.device)
            rest = dict(self._buffers)
            self._buffers.clear()
            for n in order:
                self._buffers[n] = frozen[n] if n in frozen else rest.pop(n)
            self._buffers.update(rest)
        return result

