"""Save and load LoRA adapters in the PEFT format (adapter_config.json + adapter_model.safetensors).

Tensor keys follow PEFT: `base_model.model.<module>.lora_A.weight` [r, in] and `.lora_B.weight`
[out, r], so vLLM's LoRA loader reads the same directory. `prefill_only` is an extra config key
(PEFT ignores unknown keys; the vLLM plugin reads it). Loading checks the whole file against the
config and the model before returning anything, and every error names the file and the tensor.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from engine_ext.lora import LoraSpec, LoraWeights, layer_index
from engine_ext.registry import AdapterLoadError, validate_lora

CONFIG_NAME = "adapter_config.json"
WEIGHTS_NAME = "adapter_model.safetensors"
_PREFIX = "base_model.model."


def save_peft_adapter(weights: LoraWeights, directory: str | Path) -> Path:
    """Write `weights` as a PEFT LoRA adapter directory; returns the directory."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    spec = weights.spec
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "target_modules": sorted(spec.target_modules),
        "layers_to_transform": None if spec.layers is None else list(spec.layers),
        "base_model_name_or_path": spec.base_model,
        "modules_to_save": None,
        "prefill_only": spec.prefill_only,
    }
    (out / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    tensors = {}
    for name, (a, b) in weights.tensors.items():
        tensors[f"{_PREFIX}{name}.lora_A.weight"] = a.detach().contiguous().float()
        tensors[f"{_PREFIX}{name}.lora_B.weight"] = b.detach().contiguous().float()
    save_file(tensors, str(out / WEIGHTS_NAME))
    return out


def read_adapter_config(path: Path) -> LoraSpec:
    """The LoraSpec of an adapter_config.json; AdapterLoadError names the file when it is bad."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise AdapterLoadError(str(path), "*", f"unreadable config: {err}") from err
    if raw.get("peft_type", "LORA") != "LORA":
        raise AdapterLoadError(str(path), "*", f"peft_type {raw.get('peft_type')!r} is not LORA")
    try:
        layers = raw.get("layers_to_transform")
        return LoraSpec(
            rank=raw["r"], alpha=raw.get("lora_alpha", raw["r"]),
            target_modules=tuple(sorted(raw["target_modules"])),
            layers=None if layers is None else tuple(
                [layers] if isinstance(layers, int) else layers
            ),
            prefill_only=bool(raw.get("prefill_only", False)),
            base_model=raw.get("base_model_name_or_path") or "",
        )
    except (KeyError, TypeError, ValueError) as err:
        raise AdapterLoadError(str(path), "*", f"invalid adapter config: {err}") from err


def _pair_tensors(
    raw: dict[str, torch.Tensor], spec: LoraSpec, source: str
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Group A/B tensors by module; check that both halves are there and the rank matches."""
    modules: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in raw.items():
        if not key.startswith(_PREFIX) or not key.endswith((".lora_A.weight", ".lora_B.weight")):
            raise AdapterLoadError(source, key, "not a PEFT LoRA tensor name")
        module, half = key[len(_PREFIX) :].rsplit(".", 2)[0], key.rsplit(".", 2)[1]
        modules.setdefault(module, {})[half] = tensor
    tensors = {}
    for module, halves in sorted(modules.items()):
        for half in ("lora_A", "lora_B"):
            if half not in halves:
                raise AdapterLoadError(source, f"{_PREFIX}{module}.{half}.weight", "missing")
        a, b = halves["lora_A"], halves["lora_B"]
        if a.ndim != 2 or b.ndim != 2:
            raise AdapterLoadError(source, f"{_PREFIX}{module}.lora_A.weight", "not a matrix")
        if a.shape[0] != spec.rank or b.shape[1] != spec.rank:
            raise AdapterLoadError(
                source, f"{_PREFIX}{module}.lora_A.weight",
                f"rank {a.shape[0]}/{b.shape[1]} does not match config r={spec.rank}",
            )
        tensors[module] = (a.float(), b.float())
    return tensors


def _check_coverage(
    model: nn.Module, spec: LoraSpec, tensors: dict, source: str
) -> None:
    """Every module the config targets must have tensors, and no tensor may fall outside it."""
    for module in tensors:
        leaf = module.rsplit(".", 1)[-1]
        if leaf not in spec.target_modules or (
            spec.layers is not None and layer_index(module) not in spec.layers
        ):
            raise AdapterLoadError(source, f"{_PREFIX}{module}.lora_A.weight",
                                   "module outside the config's target_modules/layers")
    for name, module in model.named_modules():
        if name.endswith(".base") or not hasattr(module, "in_features"):
            continue
        leaf = name.rsplit(".", 1)[-1]
        wanted = leaf in spec.target_modules and (
            spec.layers is None or layer_index(name) in spec.layers
        )
        if wanted and name not in tensors:
            raise AdapterLoadError(source, f"{_PREFIX}{name}.lora_A.weight", "missing")


def load_peft_adapter(
    directory: str | Path, model: nn.Module, *, base_model: str = "", max_lora_rank: int = 64
) -> LoraWeights:
    """Read and fully validate a PEFT LoRA directory against `model`; load nothing on error.

    base_model: the serving model's name; when both it and the file's base model are set they
    must agree.
    """
    root = Path(directory)
    spec = read_adapter_config(root / CONFIG_NAME)
    weights_path = root / WEIGHTS_NAME
    if spec.base_model and base_model and spec.base_model != base_model:
        raise AdapterLoadError(str(root / CONFIG_NAME), "base_model_name_or_path",
                               f"adapter is for {spec.base_model!r}, model is {base_model!r}")
    try:
        raw = load_file(str(weights_path))
    except (OSError, SafetensorError) as err:
        raise AdapterLoadError(str(weights_path), "*", f"unreadable weights: {err}") from err
    tensors = _pair_tensors(raw, spec, str(weights_path))
    _check_coverage(model, spec, tensors, str(weights_path))
    weights = LoraWeights(spec=spec, tensors=tensors)
    try:
        validate_lora(model, weights, str(weights_path), max_lora_rank)
    except AdapterLoadError as err:
        # Name the tensor as it is spelled in the file.
        key = err.tensor if err.tensor == "*" else f"{_PREFIX}{err.tensor}"
        if key.endswith((".lora_A", ".lora_B")):
            key += ".weight"
        raise AdapterLoadError(err.source, key, err.reason) from err
    return weights
