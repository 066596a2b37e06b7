"""Serving strategies as a discriminated union on `kind`, each with its own parameters."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from sim.frozen import FrozenModel
from sim.hardware.specs import LoraModule


class AdapterConfig(FrozenModel):
    """One domain adapter."""

    name: str = Field(min_length=1)
    """Adapter name (the domain it serves)."""
    rank: int = Field(default=16, ge=1, le=1024)
    """LoRA rank r (or DiReFT edit rank)."""
    target_modules: tuple[LoraModule, ...] = Field(
        default=("q_proj", "k_proj", "v_proj", "o_proj"), min_length=1)
    """Linear modules that carry the adapter (PEFT names)."""
    layers: tuple[int, ...] | None = None
    """Layers that carry the adapter; None: every layer of a decoder-only model, or on a CED model
    every layer the placement rule allows (layer-20 FFN and layers 21-39), whatever the strategy,
    so the KV is shared and a switch is a bounded replay. Explicit layers that break the rule give
    per-adapter KV and a re-prefill on a switch."""

    @field_validator("layers")
    @classmethod
    def _adapts_some_layer(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and not value:
            raise ValueError("layers=[]: an adapter on no layer adapts nothing; allowed: at least "
                             "one layer index, or no `layers` key for every layer the placement "
                             "allows")
        return value


CONTEXTUAL_HEAD_PARAMS = 2 * 5120 * 1024
"""Assumed contextual-MoL q/k head size (no published figure): two 5120 -> 1024 projections."""


class _StrategyBase(FrozenModel):
    name: str | None = Field(default=None, min_length=1)
    """Label of this strategy in reports; None uses `kind`."""
    model: str | None = None
    """Catalogue model for this strategy (CED strategies need a CED model); None: the scenario's."""
    output_length_scale: float = Field(default=1.0, gt=0, le=100)
    """Multiplier on every reply length the workload draws, for this strategy only (prefill-only
    adapters are reported to change reply length on long-form tasks); 1 keeps the workload's."""

    @property
    def label(self) -> str:
        """Name shown in reports."""
        return self.name or self.kind  # type: ignore[attr-defined]

    def sim_fields(self, adapter_names: list[str]) -> dict:
        """The simulator's strategy numbers (`sim.config.StrategySpec`) this kind sets."""
        return {}

    def decoder_only_problems(self, arch, where: str) -> list[str] | None:
        """For a kind that needs a CED model: what keeps it from a decoder-only `arch` ([]:
        nothing, it runs there); None: it needs a CED model."""
        return None


class _AdapterStrategy(_StrategyBase):
    adapters: tuple[AdapterConfig, ...] = Field(min_length=1)
    """The domain adapters served."""

    @model_validator(mode="after")
    def _unique_adapter_names(self):
        names = [a.name for a in self.adapters]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"adapters: duplicate names {dupes}; each adapter needs its own name")
        return self


class _SharedKvStrategy(_AdapterStrategy):
    replay_window_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    """Bounded replay length on a switch; None uses the model's sliding window."""
    allow_kv_breaking_placement: bool = False
    """Allow LoRA on the encoder or layer-20 attention (experiments only: the KV becomes
    per-adapter and a switch re-prefills the context)."""


class AccuracyPoint(FrozenModel):
    """A router's accuracy measured with a given number of candidate domains."""

    num_domains: int = Field(ge=1, le=100_000)
    """Candidate domains (adapters) the router chose among."""
    accuracy: float = Field(gt=0, le=1)
    """Share of decisions that picked the right adapter (over seeds: their mean)."""
    accuracy_std: float | None = Field(default=None, ge=0, le=1)
    """Sample standard deviation of the accuracy over training seeds, where measured."""
    source: str | None = Field(default=None, min_length=1)
    """Where the figure comes from (a router card fills it with its name and seeds)."""


PUBLISHED_ROUTER_ACCURACY = {"mol": 0.9711, "contextual_mol": 0.9855, "mol2": 0.9463}
"""Reference accuracies on the 4-domain benchmark of the MoL2 write-up (domain brief 2.3): the
defaults until a scenario or a router card gives its own. MoL2's is the 5-seed mean, not its top
seed (0.9731); MoL's and contextual MoL's are the single figures published."""
PUBLISHED_ACCURACY_WHAT = {"mol": "MoL L0, published 4-domain figure",
                           "contextual_mol": "Contextual MoL, published 4-domain figure",
                           "mol2": "MoL2, published 4-domain 5-seed mean"}
"""What each default in PUBLISHED_ROUTER_ACCURACY is, for the output's accuracy notes."""


class _RoutedStrategy(FrozenModel):
    router_pool: Literal["serving", "dedicated"] = "serving"
    """Where the routing passes run: on the serving GPUs (default), or on a dedicated pool of
    replicas of the same shape that the plan counts and prices."""
    num_router_replicas: int = Field(default=1, ge=1, le=10_000)
    """Replicas in the dedicated router pool (router_pool: dedicated only)."""
    router_accuracy: float | None = Field(default=None, gt=0, le=1)
    """Share of routed turns sent to the right adapter (a misrouted turn is answered by a wrong
    one, uniformly among the others); None: the curve below, else the published 4-domain figure
    (MoL 0.9711, contextual MoL 0.9855, MoL2 0.9463). A client-named adapter is always right."""
    router_accuracy_curve: tuple[AccuracyPoint, ...] | None = Field(default=None, min_length=1)
    """Accuracy by number of domains, e.g. [{num_domains: 4, accuracy: 0.97}, {num_domains: 16,
    accuracy: 0.9}]: read at the strategy's adapter count, linear between points and flat beyond
    the ends. Give this or router_accuracy, not both."""
    router_card: str | None = Field(default=None, min_length=1)
    """A router card file (JSON, from `python -m engine_ext.routers.train`; a relative path
    resolves against the scenario file's folder): its measured accuracy per number of options
    becomes router_accuracy_curve, and its decision work fills the routing fields this strategy
    leaves unset (planner.scenario.card_values). Its model, routing layer and options must be this
    strategy's. Not together with router_accuracy or router_accuracy_curve."""

    @model_validator(mode="after")
    def _one_accuracy_source(self):
        if self.router_accuracy is not None and self.router_accuracy_curve is not None:
            raise ValueError(f"router_accuracy={self.router_accuracy} and router_accuracy_curve "
                             "both given; keep one")
        points = [p.num_domains for p in self.router_accuracy_curve or ()]
        if len(set(points)) != len(points):
            raise ValueError(f"router_accuracy_curve: num_domains {points} repeat a value")
        return self

    @property
    def resolved_router_accuracy(self) -> float:
        """The accuracy the simulator samples misroutes with, at this strategy's domain count."""
        if self.router_accuracy is not None:
            return self.router_accuracy
        if self.router_accuracy_curve is None:
            return PUBLISHED_ROUTER_ACCURACY[self.kind]  # type: ignore[attr-defined]
        points = sorted(self.router_accuracy_curve, key=lambda p: p.num_domains)
        n = len(self.adapters)  # type: ignore[attr-defined]
        return float(np.interp(n, [p.num_domains for p in points],
                               [p.accuracy for p in points]))

    def sim_fields(self, adapter_names: list[str]) -> dict:
        return {**super().sim_fields(adapter_names),  # type: ignore[misc]
                "measured_decision_time_s": self.measured_decision_time_s,  # type: ignore
                "routing_accuracy": self.resolved_router_accuracy}

    def routing_layer(self, arch) -> tuple[int, str]:
        """The layer the router reads, and where that number comes from (a card must match)."""
        return arch.ced.routing_layer, f"model {arch.name!r}'s routing layer"

    def card_work_fields(self, card, work) -> dict:
        """The decision work a router card fills in (fields the user set are kept)."""
        return {"num_head_params": card.num_params}


class BaseStrategy(_StrategyBase):
    """The base model alone: no adapters, no routing."""

    kind: Literal["base"] = "base"
    """Strategy discriminator."""


class MultiLoraStrategy(_AdapterStrategy):
    """All-token LoRA on every request; the client names the adapter (S-LoRA, Punica, vLLM)."""

    kind: Literal["multi_lora"] = "multi_lora"
    """Strategy discriminator."""


class PreftStrategy(_AdapterStrategy):
    """Prefill-only adapters: prompt tokens adapted, decode on base weights."""

    kind: Literal["preft"] = "preft"
    """Strategy discriminator."""
    variant: Literal["lora_p", "direft_p"] = "lora_p"
    """lora_p: LoRA masked to prompt positions; direft_p: low-rank residual-stream edit."""

    def sim_fields(self, adapter_names: list[str]) -> dict:
        return {**super().sim_fields(adapter_names), "is_decode_adapted": False}


class MolStrategy(_RoutedStrategy, _AdapterStrategy):
    """Mixture-of-LoRA on a decoder-only model: route hop, handoff prefill, summary hop."""

    kind: Literal["mol"] = "mol"
    """Strategy discriminator."""
    router_adapter: str | None = None
    """Adapter L0 that decodes the route label; None uses the first adapter."""
    num_route_prompt_tokens: int = Field(default=1024, ge=1, le=1_000_000)
    """Route prompt plus option descriptions prefilled by L0 on each decision."""
    num_route_decode_tokens: int = Field(default=40, ge=1, le=100_000)
    """Label plus short reason decoded by L0 on each decision."""
    max_summary_tokens: int = Field(default=192, ge=0, le=100_000)
    """Summary hop length when the answering adapter is not L0."""
    measured_decision_time_s: float | None = Field(default=None, gt=0, le=3600)
    """Measured decision time. The routing pass still runs on the serving GPUs as the mechanism
    implies (it is never free); the decision takes at least this long. In the analytical
    comparisons it replaces the derived time."""

    card_router_kind: ClassVar[str] = "mol_l0"
    """The router kind of card this strategy accepts."""

    def routing_layer(self, arch) -> tuple[int, str]:
        name = self.router_adapter or self.adapters[0].name
        adapter = next(a for a in self.adapters if a.name == name)
        lowest = min(adapter.layers) if adapter.layers else 0
        return lowest, f"the lowest layer of its L0 adapter {name!r} (layers {adapter.layers})"

    def card_work_fields(self, card, work) -> dict:
        return {"num_route_prompt_tokens": work.num_prefill_tokens,
                "num_route_decode_tokens": max(work.num_decode_tokens, 1)}

    def sim_fields(self, adapter_names: list[str]) -> dict:
        router = adapter_names.index(self.router_adapter) if self.router_adapter else 0
        return {**super().sim_fields(adapter_names), "router_adapter_index": router,
                "num_route_prompt_tokens": self.num_route_prompt_tokens,
                "num_route_decode_tokens": self.num_route_decode_tokens,
                "max_summary_tokens": self.max_summary_tokens}


class ContextualMolStrategy(_RoutedStrategy, _SharedKvStrategy):
    """MoL on a CED model routed by a q/k head over H19 of the query and of the options."""

    kind: Literal["contextual_mol"] = "contextual_mol"
    """Strategy discriminator."""
    num_option_description_tokens: int = Field(default=64, ge=1, le=100_000)
    """Description tokens per option, encoded after the query in a temporary pass."""
    num_head_params: int = Field(default=CONTEXTUAL_HEAD_PARAMS, ge=1, le=10**11)
    """Routing (q/k scoring) head parameters. Default assumed, not published: q and k
    projections of H19 from 5120 to 1024 dimensions, 2 x 5120 x 1024."""
    measured_decision_time_s: float | None = Field(default=None, gt=0, le=3600)
    """Measured decision time. The routing pass still runs on the serving GPUs as the mechanism
    implies (it is never free); the decision takes at least this long. In the analytical
    comparisons it replaces the derived time."""

    card_router_kind: ClassVar[str] = "contextual_mol"
    """The router kind of card this strategy accepts."""

    def card_work_fields(self, card, work) -> dict:
        return {"num_option_description_tokens": max(round(work.num_tokens_per_option), 1),
                "num_head_params": card.num_params}

    def sim_fields(self, adapter_names: list[str]) -> dict:
        return {**super().sim_fields(adapter_names),
                "num_option_description_tokens": self.num_option_description_tokens,
                "num_head_params": self.num_head_params}


class Mol2Strategy(_RoutedStrategy, _SharedKvStrategy):
    """MoL on a CED model routed by a pointer head on H19 vs cached option embeddings."""

    kind: Literal["mol2"] = "mol2"
    """Strategy discriminator."""
    routing: Literal["in_engine", "outside_engine"] = "in_engine"
    """in_engine: the decision rides the normal prefill; outside_engine: a second prefill."""
    num_head_params: int = Field(default=15_250_000, ge=1, le=10**11)
    """Pointer-head parameters (15.25M in the reference implementation)."""
    measured_decision_time_s: float | None = Field(default=None, gt=0, le=3600)
    """Measured decision time. Outside the engine the routing prefill still runs on the serving
    GPUs (it is never free) and the decision takes at least this long; in the engine the head's
    GPU time inside the answer's prefill step is at least this. In the analytical comparisons
    it replaces the derived time."""

    route_layer: int | None = Field(default=None, ge=0)
    """Decoder-only models only: the decoder layer whose output the pointer head reads, as the
    molcap vLLM plugin routes inside the engine (every adapter sits above it, so the state it
    reads is the base model's; the KV above it is per adapter). None: the CED model's routing
    layer."""

    card_router_kind: ClassVar[str] = "mol2"
    """The router kind of card this strategy accepts."""

    def sim_fields(self, adapter_names: list[str]) -> dict:
        return {**super().sim_fields(adapter_names), "routing": self.routing,
                "num_head_params": self.num_head_params}

    def routing_layer(self, arch) -> tuple[int, str]:
        if self.route_layer is not None:
            return self.route_layer, "its route_layer"
        return super().routing_layer(arch)

    def decoder_only_problems(self, arch, where: str) -> list[str] | None:
        if self.route_layer is None:
            return None
        k, top = self.route_layer, arch.num_layers - 1
        if k >= top:
            return [f"{where}.route_layer: {k} leaves no layer above it for the adapters of "
                    f"{arch.name!r} ({arch.num_layers} layers); allowed: 0..{top - 1}"]
        out = []
        if self.routing != "in_engine":
            out.append(f"{where}.routing: {self.routing!r} with route_layer on decoder-only "
                       f"{arch.name!r}: the pointer head rides the answer's prefill there; "
                       "allowed: in_engine")
        for j, a in enumerate(self.adapters):
            if a.layers is None or min(a.layers) <= k:
                shown = "every layer" if a.layers is None else list(a.layers)
                out.append(f"{where}.adapters.{j}.layers: {shown} reaches route_layer {k} or "
                           f"below (the router reads layer {k}'s adapter-free output); allowed: "
                           f"layers {k + 1}..{top}")
        return out


class MultiAgentStrategy(_AdapterStrategy):
    """One full model copy per domain; history handed over as text and prefilled again."""

    kind: Literal["multi_agent"] = "multi_agent"
    """Strategy discriminator."""
    num_handover_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    """Text handed to the next agent; None hands over the whole history."""

    def sim_fields(self, adapter_names: list[str]) -> dict:
        return {**super().sim_fields(adapter_names),
                "num_handover_tokens": self.num_handover_tokens}


StrategyConfig = Annotated[
    BaseStrategy | MultiLoraStrategy | PreftStrategy | MolStrategy | ContextualMolStrategy
    | Mol2Strategy | MultiAgentStrategy,
    Field(discriminator="kind"),
]
