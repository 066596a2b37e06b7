"""Router cards: what one trained router measured, in a file the planner reads (no torch).

A card is written by `engine_ext.routers.train` (one per trained router) and names the router's
kind, the model and routing layer it reads, its parameters, and per setting (number of options)
the held-out accuracy over seeds and the measured decision time with the hardware it ran on.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from sim.frozen import FrozenModel

RouterKind = Literal["mol_l0", "contextual_mol", "mol2"]
CARD_SCHEMA = 1


class DecisionTime(FrozenModel):
    """Wall time of one routing decision, measured on `hardware`."""

    p50_ms: float = Field(ge=0)
    """Median per request at batch 1."""
    p99_ms: float = Field(ge=0)
    """99th percentile per request at batch 1."""
    batched_p50_ms: float = Field(ge=0)
    """Median per request when `batch_size` requests are decided together."""
    batched_p99_ms: float = Field(ge=0)
    """99th percentile per request, batched."""
    batch_size: int = Field(ge=1)
    """Requests decided together in the batched measurement."""
    num_requests: int = Field(ge=1)
    """Requests timed at batch 1."""
    includes: str = Field(min_length=1)
    """What the time covers (and what it leaves to the serving prefill)."""
    p50_cpu_ms: float | None = Field(default=None, ge=0)
    """Median CPU time of the deciding thread per request at batch 1 (one torch thread: the
    compute itself, less sensitive than wall time to other jobs on a shared machine)."""
    p99_cpu_ms: float | None = Field(default=None, ge=0)
    """99th percentile CPU time per request at batch 1."""
    batched_p50_cpu_ms: float | None = Field(default=None, ge=0)
    """Median CPU time per request, batched."""


class DecisionWork(FrozenModel):
    """Model work one decision adds to serving, for the simulator to price on other hardware."""

    num_prefill_tokens: int = Field(ge=0)
    """Tokens the decision prefills beyond the request's own prompt (route prompt, options)."""
    num_decode_tokens: int = Field(ge=0)
    """Tokens the decision decodes (the label and reason of MoL L0)."""
    num_head_params: int = Field(ge=0)
    """Parameters of the scoring head run per decision (0 for a decoded label)."""
    num_tokens_per_option: float = Field(default=0.0, ge=0)
    """Mean description tokens per option (Contextual MoL encodes them per decision, MoL2 once
    at start-up; 0 where not recorded)."""
    num_cached_prefix_tokens: int = Field(default=0, ge=0)
    """Tokens of a prompt prefix shared by every decision of the option set, prefilled once and
    read from cache (MoL L0's option list): attended to per decision, not recomputed."""


class SettingResult(FrozenModel):
    """Held-out accuracy and decision cost of the router on one routing setting."""

    setting: str = Field(min_length=1)
    """Data setting (e.g. domains4, clinc_domains10, clinc_intents150, banking77)."""
    num_options: int = Field(ge=2)
    """Options the router chooses between."""
    options: tuple[str, ...] = Field(min_length=2)
    """Option (adapter or domain) names."""
    num_test: int = Field(ge=1)
    """Held-out test samples."""
    accuracy_per_seed: tuple[float, ...] = Field(min_length=1)
    """Test accuracy of each training seed, in `seeds` order."""
    accuracy_mean: float = Field(ge=0, le=1)
    """Mean over seeds."""
    accuracy_std: float = Field(ge=0)
    """Sample standard deviation over seeds (0 for one seed)."""
    train_seconds_mean: float = Field(ge=0)
    """Mean training wall time per seed (cached frozen states not included)."""
    decision: DecisionTime | None = None
    """Measured decision time, as the router runs in the serving engine; None: not timed yet
    (pending a quiet machine; the card's `training` says the command)."""
    standalone: DecisionTime | None = None
    """Measured as a separate request (the prefill up to the routing layer included), where that
    differs from `decision` (MoL2 in the engine shares the request's own prefill)."""
    work: DecisionWork
    """Decision work per request."""
    data_fingerprint: str = Field(min_length=1)
    """sha256 prefix of the options and splits (`engine_ext.routers.datasets.fingerprint`)."""

    @model_validator(mode="after")
    def _consistent(self) -> SettingResult:
        if len(self.options) != self.num_options:
            raise ValueError(f"options: {len(self.options)} names for num_options="
                             f"{self.num_options}")
        if any(not 0 <= a <= 1 for a in self.accuracy_per_seed):
            raise ValueError(f"accuracy_per_seed: {self.accuracy_per_seed} must lie in [0, 1]")
        mean = statistics.fmean(self.accuracy_per_seed)
        if abs(mean - self.accuracy_mean) > 1e-6:
            raise ValueError(f"accuracy_mean: {self.accuracy_mean} is not the mean "
                             f"{mean:.6f} of accuracy_per_seed")
        return self


class Hardware(FrozenModel):
    """Where the decision times were measured."""

    cpu: str = Field(min_length=1)
    """CPU model name."""
    num_threads: int = Field(ge=1)
    """torch threads used."""
    load_average: tuple[float, float, float]
    """os.getloadavg() when the timing started (a shared machine: compare ratios in one run)."""
    accelerator: str = "none"
    """GPU or 'none'."""


class RegimeResult(FrozenModel):
    """Accuracy after one training regime (generic routing data and domain data)."""

    regime: Literal["generic_only", "mixed", "staged"]
    """generic_only: generic data alone; mixed: generic and domain batches in turn; staged:
    generic first, then domain data only."""
    accuracy_per_seed: dict[str, tuple[float, ...]]
    """Test accuracy per setting and seed."""


class RouterCard(FrozenModel):
    """One trained router: kind, model and routing layer, parameters, results per setting."""

    schema_version: Literal[1] = CARD_SCHEMA
    """Card format version."""
    name: str = Field(min_length=1)
    """Card name (file stem)."""
    router: RouterKind
    """mol_l0 (decoded label), contextual_mol (q/k head), mol2 (pointer head)."""
    model: str = Field(min_length=1)
    """Model whose states the router reads (smollm2-135m-instruct, ced-small)."""
    routing_layer: int = Field(ge=0)
    """Layer whose output the router reads (for mol_l0: the lowest layer its LoRA adapts)."""
    num_params: int = Field(ge=1)
    """Trained parameters (head, or LoRA for mol_l0)."""
    seeds: tuple[int, ...] = Field(min_length=1)
    """Training seeds."""
    training: str = Field(min_length=1)
    """How it was trained (steps, samples, learning rate)."""
    command: str = Field(min_length=1)
    """Command that wrote this card."""
    data_sources: tuple[str, ...] = Field(min_length=1)
    """Files the training and test text came from."""
    hardware: Hardware
    """Where decision times were measured."""
    settings: tuple[SettingResult, ...] = Field(min_length=1)
    """Results per routing setting."""
    regimes: tuple[RegimeResult, ...] = ()
    """Mixed vs staged training (measured for MoL2)."""

    @model_validator(mode="after")
    def _seeds_match(self) -> RouterCard:
        for i, s in enumerate(self.settings):
            if len(s.accuracy_per_seed) != len(self.seeds):
                raise ValueError(f"settings.{i}.accuracy_per_seed: {len(s.accuracy_per_seed)} "
                                 f"values for {len(self.seeds)} seeds")
        return self

    def setting_for(self, num_options: int) -> SettingResult | None:
        """The setting with exactly `num_options` options, if measured."""
        return next((s for s in self.settings if s.num_options == num_options), None)


class RouterCardError(ValueError):
    """A card file that cannot be used; the message names the file and the field."""


def load_router_card(path: str | Path) -> RouterCard:
    """Read and validate a card (JSON); errors name the file and the field."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise RouterCardError(f"{path}: cannot read router card: {err}") from None
    except json.JSONDecodeError as err:
        raise RouterCardError(f"{path}:{err.lineno}: malformed JSON: {err.msg}") from None
    try:
        return RouterCard.model_validate(raw)
    except ValidationError as err:
        lines = [f"{path}: {'.'.join(map(str, e['loc'])) or '<top>'}: {e['msg']}"
                 for e in err.errors()]
        raise RouterCardError("\n".join(lines)) from None


def write_router_card(card: RouterCard, path: str | Path) -> Path:
    """Write a card as indented JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(card.model_dump_json(indent=2) + "\n")
    return path
