"""Workloads, a discriminated union on `kind`: Punica-style, multi-turn conversations, traces."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from sim.frozen import FrozenModel

MAX_RATE_PER_S = 1e6
"""Above a million requests per second per scenario a rate is a typo, not a workload."""


class OutputLengths(FrozenModel):
    """How reply (output) lengths are drawn around the workload's own length."""

    distribution: Literal["fixed", "lognormal", "trace"] = "fixed"
    """fixed: every reply has the workload's length (Punica's benchmark); lognormal: median the
    workload's length, shape lognormal_sigma; trace: drawn with replacement from the output
    lengths of a trace file."""
    lognormal_sigma: float = Field(default=0.8, gt=0, le=5)
    """Shape of the lognormal (the log-space standard deviation)."""
    trace_path: str = "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    """Trace whose output lengths are sampled; relative paths resolve against the scenario's
    folder, then the shipped traces (data/traces)."""
    trace_format: Literal["csv", "jsonl"] = "csv"
    """File format of trace_path."""
    trace_column: str = "GeneratedTokens"
    """Output-length column of trace_path."""
    max_tokens: int = Field(default=8192, ge=1, le=10_000_000)
    """Drawn lengths are clipped to 1..max_tokens."""


class PunicaWorkload(FrozenModel):
    """Punica's multi-adapter benchmark: lognormal prompts, fixed outputs, one of four mixes."""

    kind: Literal["punica"] = "punica"
    """Workload discriminator."""
    num_requests: int = Field(default=1000, ge=1, le=100_000_000)
    """Requests generated."""
    num_adapters: int = Field(default=8, ge=1, le=100_000)
    """Adapters the requests are spread over (the strategy's adapters are cycled)."""
    popularity: Literal["identical", "uniform", "skewed", "distinct"] = "uniform"
    """identical: all adapter 0; uniform; skewed: Zipf(zipf_alpha); distinct: i mod N, shuffled."""
    zipf_alpha: float = Field(default=1.0, gt=0, le=10)
    """Zipf exponent of the skewed mix."""
    prompt_lognormal_sigma: float = Field(default=0.8, gt=0, le=10)
    """Shape of the prompt-length lognormal (scipy's s)."""
    prompt_lognormal_loc: float = Field(default=-1.0, ge=-1e6, le=1e6)
    """Shift of the prompt-length lognormal (scipy's loc)."""
    prompt_lognormal_scale: float = Field(default=18.0, gt=0, le=1e6)
    """Scale of the prompt-length lognormal (scipy's scale)."""
    max_prompt_tokens: int = Field(default=2048, ge=1, le=10_000_000)
    """Prompt lengths are clipped to this."""
    num_output_tokens: int = Field(default=128, ge=1, le=10_000_000)
    """Output length of every request (the median under a lognormal `output_lengths`)."""
    output_lengths: OutputLengths = OutputLengths()
    """Fixed (Punica's benchmark), lognormal around num_output_tokens, or sampled from a trace."""
    arrival_rate_per_s: float | None = Field(default=None, gt=0, le=MAX_RATE_PER_S)
    """Poisson arrival rate; None submits every request at time 0 (the original benchmark)."""
    named_adapter_share: float = Field(default=0.0, ge=0, le=1)
    """Share of requests (turns) whose client names the adapter, drawn per turn: under a routed
    strategy they skip the router and are always right; the rest are routed."""


class ConversationWorkload(FrozenModel):
    """Multi-turn conversations whose domain walks a Markov chain over the adapters."""

    kind: Literal["conversations"] = "conversations"
    """Workload discriminator."""
    num_conversations: int = Field(default=200, ge=1, le=10_000_000)
    """Conversations generated."""
    num_turns: int = Field(default=6, ge=1, le=10_000)
    """Turns per conversation."""
    switch_probability: float = Field(default=0.3, ge=0, le=1)
    """Probability that a turn moves to another domain (uniform over the others)."""
    num_initial_context_tokens: int = Field(default=1024, ge=0, le=10_000_000)
    """System prompt and documents before the first user turn."""
    num_user_tokens: int = Field(default=128, ge=1, le=10_000_000)
    """Tokens of each user turn."""
    num_reply_tokens: int = Field(default=256, ge=1, le=10_000_000)
    """Tokens of each reply (the median under a lognormal `output_lengths`)."""
    output_lengths: OutputLengths = OutputLengths()
    """Fixed, lognormal around num_reply_tokens, or sampled from a trace."""
    think_time_s: float = Field(default=5.0, ge=0, le=86_400)
    """Mean user think time between a reply and the next turn (exponential)."""
    arrival_rate_per_s: float = Field(default=1.0, gt=0, le=MAX_RATE_PER_S)
    """Poisson arrival rate of new conversations."""
    named_adapter_share: float = Field(default=0.0, ge=0, le=1)
    """Share of requests (turns) whose client names the adapter, drawn per turn: under a routed
    strategy they skip the router and are always right; the rest are routed."""

    @property
    def num_final_context_tokens(self) -> int:
        """Context length at the last turn's end."""
        per_turn = self.num_user_tokens + self.num_reply_tokens
        return self.num_initial_context_tokens + self.num_turns * per_turn


class TraceColumns(FrozenModel):
    """Which columns of a trace file hold what."""

    arrival_time: str = "timestamp"
    """Arrival time column."""
    num_input_tokens: str = "input_length"
    """Prompt length column."""
    num_output_tokens: str = "output_length"
    """Output length column."""
    hash_ids: str | None = None
    """Prefix-block hash-id list column (Mooncake), or None."""
    adapter: str | None = None
    """Adapter/client column, or None to draw adapters uniformly."""


class TraceWorkload(FrozenModel):
    """Replay of a request trace file (Azure, Mooncake, ServeGen-derived)."""

    kind: Literal["trace"] = "trace"
    """Workload discriminator."""
    path: str = Field(min_length=1)
    """Trace file; a relative path resolves against the scenario file's folder (the repository
    ships slices in data/traces)."""
    format: Literal["csv", "jsonl"] = "csv"
    """File format."""
    columns: TraceColumns = TraceColumns()
    """Column mapping."""
    time_unit: Literal["s", "ms", "datetime"] = "s"
    """Unit of the arrival-time column (datetime: ISO timestamps)."""
    hash_block_tokens: int = Field(default=512, ge=1, le=1_000_000)
    """Tokens per prefix-block hash id (512 in the Mooncake traces)."""
    rate_scale: float = Field(default=1.0, gt=0, le=1e6)
    """Arrival rate multiplier (inter-arrival gaps are divided by it)."""
    length_scale: float = Field(default=1.0, gt=0, le=1e3)
    """Multiplier applied to input and output lengths."""
    max_requests: int | None = Field(default=None, ge=1, le=100_000_000)
    """Replay at most this many rows; None replays the whole file."""
    popularity: Literal["uniform", "servegen"] = "uniform"
    """Adapter mix when the trace has no adapter column: uniform, or servegen (weights are the
    mean request rates of the busiest ServeGen clients, one client per adapter)."""
    named_adapter_share: float = Field(default=0.0, ge=0, le=1)
    """Share of requests (turns) whose client names the adapter, drawn per turn: under a routed
    strategy they skip the router and are always right; the rest are routed."""

    @model_validator(mode="after")
    def _popularity_needs_no_adapter_column(self) -> TraceWorkload:
        if self.popularity != "uniform" and self.columns.adapter is not None:
            raise ValueError(
                f"popularity={self.popularity!r} draws adapters, but columns.adapter="
                f"{self.columns.adapter!r} already names them; drop one of the two"
            )
        return self

    @model_validator(mode="after")
    def _hash_ids_need_jsonl(self) -> TraceWorkload:
        if self.columns.hash_ids is not None and self.format != "jsonl":
            raise ValueError(
                f"columns.hash_ids={self.columns.hash_ids!r} needs format='jsonl' "
                f"(hash-id lists only exist in JSON lines), got format={self.format!r}"
            )
        return self


WorkloadConfig = Annotated[
    PunicaWorkload | ConversationWorkload | TraceWorkload, Field(discriminator="kind")
]


OFFLINE_NOTE = ("workload: no arrival rate (every request at t=0, an offline throughput "
                "benchmark): simulated and reported; the capacity search needs a rate "
                "(set workload.arrival_rate_per_s)")
"""The one line `molcap run` and `molcap validate` print for an offline scenario."""


def is_offline(workload: WorkloadConfig) -> bool:
    """True when every request arrives at t=0 (no arrival rate): simulate, do not plan."""
    return isinstance(workload, PunicaWorkload) and workload.arrival_rate_per_s is None
