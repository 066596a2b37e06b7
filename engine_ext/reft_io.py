"""Save and load DiReFT adapters: adapter_config.json (peft_type DIREFT) + safetensors weights.

The directory layout matches a PEFT LoRA adapter so the same tooling (and a vLLM `LoRARequest`
naming the directory) can carry it; the vLLM plugin recognises the `DIREFT` type and applies the
edit itself. Tensors: `layers.<i>.direft.proj_a` [r, D], `.proj_b` [r, D], `.bias` [r]. Loading
checks the whole directory against the serving model (base model, width, layers, rank) before
returning anything; every error names the file, the tensor or field, the value and what is allowed.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from engine_ext.peft_io import CONFIG_NAME, WEIGHTS_NAME
from engine_ext.reft import ReftSpec, ReftWeights
from engine_ext.registry import AdapterLoadError

PEFT_TYPE = "DIREFT"
_PARTS = ("proj_a", "proj_b", "bias")


def _key(layer: int, part: str) -> str:
    return f"layers.{layer}.direft.{part}"


def save_reft_adapter(weights: ReftWeights, directory: str | Path, *, base_model: str = "",
                      hidden_size: int | None = None) -> Path:
    """Write `weights` as a DiReFT adapter directory; returns the directory."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    spec = weights.spec
    width = hidden_size or next(iter(weights.tensors.values()))[0].shape[1]
    config = {"peft_type": PEFT_TYPE, "r": spec.rank, "layers": list(spec.layers),
              "prefill_only": spec.prefill_only, "first_positions": spec.first_positions,
              "last_positions": spec.last_positions, "hidden_size": width,
              "base_model_name_or_path": base_model}
    tensors = {}
    for layer, parts in weights.tensors.items():
        for part, tensor in zip(_PARTS, parts, strict=True):
            tensors[_key(layer, part)] = tensor.detach().contiguous().float()
    save_file(tensors, str(out / WEIGHTS_NAME))
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    return out


def is_reft_adapter(directory: str | Path) -> bool:
    """Whether `directory` holds a DiReFT adapter (its config says peft_type DIREFT)."""
    try:
        raw = json.loads((Path(directory) / CONFIG_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(raw, dict) and raw.get("peft_type") == PEFT_TYPE


def read_reft_config(path: Path) -> tuple[ReftSpec, dict]:
    """(spec, raw config) of a DiReFT adapter_config.json; AdapterLoadError when it is bad."""
    try:
        raw = json.loads(path.read_text())
        spec = ReftSpec(rank=raw["r"], layers=tuple(raw["layers"]),
                        prefill_only=bool(raw.get("prefill_only", True)),
                        first_positions=raw.get("first_positions"),
                        last_positions=raw.get("last_positions"))
    except (OSError, json.JSONDecodeError) as err:
        raise AdapterLoadError(str(path), "*", f"unreadable config: {err}") from err
    except (KeyError, TypeError, ValidationError) as err:
        raise AdapterLoadError(str(path), "*", f"invalid DiReFT config: {err}") from err
    return spec, raw


def load_reft_adapter(directory: str | Path, *, hidden_size: int, num_layers: int,
                      base_model: str = "", max_rank: int = 64,
                      min_layer: int = 0) -> ReftWeights:
    """Read and fully validate a DiReFT directory against a model of `hidden_size` x `num_layers`.

    base_model: the serving model's name; when both it and the file's are set they must agree.
    min_layer: lowest layer an edit may sit on (route layer k + 1 when routing).
    """
    root = Path(directory)
    config_path = root / CONFIG_NAME
    spec, raw = read_reft_config(config_path)
    source = str(config_path)
    own_base = raw.get("base_model_name_or_path") or ""
    if own_base and base_model and own_base != base_model:
        raise AdapterLoadError(source, "base_model_name_or_path",
                               f"adapter is for {own_base!r}, the model is {base_model!r}")
    if raw.get("hidden_size") not in (None, hidden_size):
        raise AdapterLoadError(source, "hidden_size",
                               f"{raw['hidden_size']} != the model's {hidden_size}")
    if spec.rank > max_rank:
        raise AdapterLoadError(source, "r", f"rank {spec.rank} > max rank {max_rank}")
    bad = [x for x in spec.layers if not min_layer <= x < num_layers]
    if bad:
        raise AdapterLoadError(source, "layers",
                               f"layers {bad} outside the allowed {min_layer}..{num_layers - 1}")
    weights_path = root / WEIGHTS_NAME
    try:
        raw_tensors = load_file(str(weights_path))
    except (OSError, SafetensorError) as err:
        raise AdapterLoadError(str(weights_path), "*", f"unreadable weights: {err}") from err
    expected = {_key(layer, part) for layer in spec.layers for part in _PARTS}
    for key in sorted(set(raw_tensors) ^ expected):
        reason = "missing" if key in expected else "outside the config's layers"
        raise AdapterLoadError(str(weights_path), key, reason)
    tensors = {}
    for layer in spec.layers:
        parts = tuple(raw_tensors[_key(layer, part)].float() for part in _PARTS)
        for part, tensor, shape in zip(_PARTS, parts, ((spec.rank, hidden_size),) * 2
                                       + ((spec.rank,),), strict=True):
            if tuple(tensor.shape) != shape:
                raise AdapterLoadError(str(weights_path), _key(layer, part),
                                       f"shape {tuple(tensor.shape)} != {shape}")
        tensors[layer] = parts
    return ReftWeights(spec=spec, tensors=tensors)
