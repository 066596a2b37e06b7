"""Workloads as columnar arrays: conversations and their turns (a single request is a one-turn
conversation with no prior context), generated from a seeded numpy Generator.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


class HashIds:
    """Per turn, trace prefix-block ids held as two flat arrays (ids, and where each turn's
    start): a million turns of ~25 ids as tuples of Python ints would take a gigabyte. Reads
    as a sequence of tuples of ints."""

    def __init__(self, ids: np.ndarray, starts: np.ndarray):
        """`ids`: every turn's ids end to end; `starts`: [T + 1] offsets into `ids`."""
        self.ids, self.starts = ids, starts

    @classmethod
    def of(cls, per_turn) -> HashIds:
        """From a sequence of id sequences."""
        lengths = np.fromiter(map(len, per_turn), dtype=np.int64, count=len(per_turn))
        flat = [i for ids in per_turn for i in ids]
        try:
            ids = np.array(flat, dtype=np.int64)
        except OverflowError:  # ids past 64 bits stay Python ints
            ids = np.array(flat, dtype=object)
        return cls(ids, np.concatenate([[0], np.cumsum(lengths)]))

    def __len__(self) -> int:
        return self.starts.size - 1

    def __getitem__(self, turn: int) -> tuple[int, ...]:
        return tuple(self.ids[self.starts[turn]:self.starts[turn + 1]].tolist())

    def __iter__(self):
        return (self[t] for t in range(len(self)))

    def take(self, turns: np.ndarray) -> HashIds:
        """The ids of `turns`, in that order."""
        turns = np.asarray(turns, dtype=np.int64)
        lengths = self.starts[turns + 1] - self.starts[turns]
        starts = np.concatenate([[0], np.cumsum(lengths)])
        # Position of every kept id in `ids`: its turn's start plus its index within the turn.
        within = np.arange(starts[-1]) - np.repeat(starts[:-1], lengths)
        return HashIds(self.ids[np.repeat(self.starts[turns], lengths) + within], starts)


@dataclass(frozen=True, eq=False)
class Workload:
    """Conversations sorted by arrival; turn arrays hold every conversation's turns in order."""

    conv_arrival_s: np.ndarray
    """float [C]: arrival of the first turn."""
    conv_first_turn: np.ndarray
    """int [C]: index of the conversation's first turn in the turn arrays."""
    conv_num_turns: np.ndarray
    """int [C]: turns of the conversation."""
    conv_initial_tokens: np.ndarray
    """int [C]: context (system prompt, documents) before the first user turn."""
    turn_domain: np.ndarray
    """int [T]: domain (adapter index) of the turn."""
    turn_user_tokens: np.ndarray
    """int [T]: tokens of the user turn (the whole prompt of a one-turn request)."""
    turn_reply_tokens: np.ndarray
    """int [T]: tokens of the reply."""
    turn_think_s: np.ndarray
    """float [T]: user think time between the previous reply and this turn (0 for the first)."""
    turn_hash_ids: HashIds | tuple[tuple[int, ...], ...] | None = None
    """Per turn, trace prefix-block ids naming the prompt's KV blocks (Mooncake); or None."""
    hash_block_tokens: int = 512
    """Tokens per trace hash id."""
    turn_is_named: np.ndarray | None = None
    """bool [T]: the client names the turn's adapter, so no router runs (None: no turn does)."""

    @property
    def num_conversations(self) -> int:
        """Conversations."""
        return int(self.conv_arrival_s.size)

    @property
    def num_turns(self) -> int:
        """Turns over all conversations."""
        return int(self.turn_domain.size)

    def max_context_tokens(self) -> int:
        """Longest context any conversation reaches (its last turn's prompt plus reply)."""
        per_turn = self.turn_user_tokens + self.turn_reply_tokens
        grown = np.add.reduceat(per_turn, self.conv_first_turn)
        return int((grown + self.conv_initial_tokens).max())


def with_named_share(rng: np.random.Generator, workload: Workload, share: float) -> Workload:
    """`workload` with a share of its turns naming their adapter (drawn per turn)."""
    if share <= 0:
        return workload
    return replace(workload, turn_is_named=rng.random(workload.num_turns) < share)


def with_reply_scale(workload: Workload, scale: float) -> Workload:
    """`workload` with every reply length multiplied by `scale` (at least one token)."""
    if scale == 1:
        return workload
    scaled = np.maximum(1, np.rint(workload.turn_reply_tokens * scale)).astype(np.int64)
    return replace(workload, turn_reply_tokens=scaled)


def draw_lengths(rng: np.random.Generator, num: int, *, distribution: str, median: int,
                 sigma: float = 0.8, samples: np.ndarray | None = None,
                 max_tokens: int = 8192) -> np.ndarray:
    """Output lengths: fixed at `median`, lognormal around it, or drawn from `samples`."""
    if distribution == "fixed":
        return np.full(num, median, dtype=np.int64)
    if distribution == "lognormal":
        raw = median * np.exp(sigma * rng.standard_normal(num))
    elif distribution == "trace":
        raw = rng.choice(np.asarray(samples), size=num)
    else:
        raise ValueError(f"distribution={distribution!r}; allowed: fixed, lognormal, trace")
    return np.clip(np.rint(raw), 1, max_tokens).astype(np.int64)


def single_turn_workload(arrival_s, prompt_tokens, output_tokens, domains,
                         hash_ids=None, hash_block_tokens: int = 512) -> Workload:
    """One-turn conversations (independent requests)."""
    arrival = np.asarray(arrival_s, dtype=float)
    order = np.argsort(arrival, kind="stable")
    n = arrival.size
    return Workload(
        conv_arrival_s=arrival[order], conv_first_turn=np.arange(n),
        conv_num_turns=np.ones(n, dtype=np.int64), conv_initial_tokens=np.zeros(n, np.int64),
        turn_domain=np.asarray(domains, dtype=np.int64)[order],
        turn_user_tokens=np.asarray(prompt_tokens, dtype=np.int64)[order],
        turn_reply_tokens=np.asarray(output_tokens, dtype=np.int64)[order],
        turn_think_s=np.zeros(n),
        turn_hash_ids=None if hash_ids is None else HashIds.of(hash_ids).take(order),
        hash_block_tokens=hash_block_tokens)


def popularity_domains(rng: np.random.Generator, num_requests: int, num_domains: int,
                       popularity: str, zipf_alpha: float = 1.0) -> np.ndarray:
    """Adapter of each request under Punica's mixes: identical, uniform, skewed, distinct."""
    if popularity == "identical":
        return np.zeros(num_requests, dtype=np.int64)
    if popularity == "uniform":
        return rng.integers(num_domains, size=num_requests)
    if popularity == "skewed":
        weights = 1.0 / np.arange(1, num_domains + 1) ** zipf_alpha
        return rng.choice(num_domains, size=num_requests, p=weights / weights.sum())
    if popularity == "distinct":
        return rng.permutation(np.arange(num_requests) % num_domains)
    raise ValueError(f"popularity={popularity!r}; allowed: identical, uniform, skewed, distinct")


def poisson_arrivals(rng: np.random.Generator, num: int, rate_per_s: float | None) -> np.ndarray:
    """Arrival times of a Poisson process; all at 0 when the rate is None."""
    if rate_per_s is None:
        return np.zeros(num)
    return np.cumsum(rng.exponential(1.0 / rate_per_s, size=num))


def punica_workload(rng: np.random.Generator, *, num_requests: int, num_adapters: int,
                    popularity: str = "uniform", zipf_alpha: float = 1.0,
                    prompt_lognormal_sigma: float = 0.8, prompt_lognormal_loc: float = -1.0,
                    prompt_lognormal_scale: float = 18.0, max_prompt_tokens: int = 2048,
                    num_output_tokens: int = 128,
                    arrival_rate_per_s: float | None = None) -> Workload:
    """Punica's benchmark: lognormal prompts (scipy's s, loc, scale), fixed outputs, a mix."""
    normal = rng.standard_normal(num_requests)
    raw = prompt_lognormal_loc + prompt_lognormal_scale * np.exp(prompt_lognormal_sigma * normal)
    prompts = np.clip(np.rint(raw), 1, max_prompt_tokens).astype(np.int64)
    domains = popularity_domains(rng, num_requests, num_adapters, popularity, zipf_alpha)
    arrivals = poisson_arrivals(rng, num_requests, arrival_rate_per_s)
    return single_turn_workload(arrivals, prompts, np.full(num_requests, num_output_tokens),
                                domains)


def markov_domains(rng: np.random.Generator, num_turns: int, num_domains: int,
                   switch_probability: float) -> np.ndarray:
    """Domains of one conversation: uniform start, then move to another with the probability."""
    domains = np.empty(num_turns, dtype=np.int64)
    domains[0] = rng.integers(num_domains)
    switches = rng.random(num_turns) < switch_probability
    steps = rng.integers(1, max(num_domains, 2), size=num_turns)
    for t in range(1, num_turns):
        moved = switches[t] and num_domains > 1
        domains[t] = (domains[t - 1] + steps[t]) % num_domains if moved else domains[t - 1]
    return domains


def conversation_workload(rng: np.random.Generator, *, num_conversations: int, num_turns: int,
                          num_domains: int, switch_probability: float = 0.3,
                          num_initial_context_tokens: int = 1024, num_user_tokens: int = 128,
                          num_reply_tokens: int = 256, think_time_s: float = 5.0,
                          arrival_rate_per_s: float = 1.0) -> Workload:
    """Multi-turn conversations whose domain walks a Markov chain over the adapters."""
    c, t = num_conversations, num_turns
    domains = np.concatenate([markov_domains(rng, t, num_domains, switch_probability)
                              for _ in range(c)])
    think = rng.exponential(think_time_s, size=c * t) if think_time_s > 0 else np.zeros(c * t)
    think[::t] = 0.0
    return Workload(
        conv_arrival_s=poisson_arrivals(rng, c, arrival_rate_per_s),
        conv_first_turn=np.arange(c) * t, conv_num_turns=np.full(c, t),
        conv_initial_tokens=np.full(c, num_initial_context_tokens),
        turn_domain=domains, turn_user_tokens=np.full(c * t, num_user_tokens),
        turn_reply_tokens=np.full(c * t, num_reply_tokens), turn_think_s=think)
