"""One engine request (a "sequence", as vLLM calls it) and how its KV blocks are named.

A sequence prefills `num_prompt_tokens`, then decodes `num_output_tokens` (0 for a pass that only
exposes a layer's state). Its leading `num_stream_prompt_tokens` come from a conversation's text
stream, so their full blocks are cacheable under (namespace, stream, block index); a tail of
private tokens (a route prompt, option descriptions) is never shared. When the outputs continue
the stream (a reply), their blocks become cacheable too.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sim.memory.kv_blocks import KvBlockManager

PRIVATE_STREAM = -1


@dataclass(slots=True, eq=False)
class Sequence:
    """One request inside an engine, with its progress."""

    seq_id: int
    hop: str
    """What the request is for: answer, route, summary, routing_prefill, handover, ..."""
    adapter: int
    """Adapter applied (-1: none)."""
    kv_namespace: int
    """Prefix-cache namespace: the adapter when KV depends on it, -1 when it is shared."""
    num_prompt_tokens: int
    num_output_tokens: int
    submit_s: float
    stream_id: int = PRIVATE_STREAM
    num_stream_prompt_tokens: int = 0
    is_output_in_stream: bool = False
    hash_ids: tuple[int, ...] | None = None
    """Trace prefix-block ids (Mooncake); they replace (stream, index) as block names."""
    hash_block_tokens: int = 512
    first_layer: int = 0
    last_layer: int = -1
    """One past the last layer the prefill runs (-1: every layer)."""
    is_prefill_adapted: bool = True
    is_decode_adapted: bool = True
    num_replay_tokens: int = 0
    """Bounded replay run with the first prefill step (a CED switch): the W positions before
    the first computed token, when they came from the prefix cache."""
    num_replay_context_tokens: int = 0
    """Tokens before the replayed window's end (set on admission: the cached prefix)."""
    num_reencode_tokens: int = 0
    """Encoder window W that a prompt starting after a cached prefix re-encodes first (a CED
    turn encodes C[-W:] + U; the encoder's window KV is not kept between requests)."""
    num_reencode_context_tokens: int = 0
    """Cached tokens the re-encoded window ends at (set on admission; 0: no re-encode)."""
    num_routing_decisions: int = 0
    """Routing-head decisions priced in the step that completes the prompt."""
    is_kv_preloaded: bool = False
    """The prompt's KV arrived by transfer (disaggregated decode): allocate, do not compute."""
    owner: Any = None
    """The turn (or other caller) this sequence belongs to."""
    on_done: Any = None
    """Called with the sequence (from a SimPy event at its finish time) when it finishes."""
    # progress
    num_computed_tokens: int = 0
    num_generated_tokens: int = 0
    num_blocks: int = 0
    """KV blocks held."""
    block_runs: list[range] = field(default_factory=list)
    """Keys of the cached blocks held, in block order (the others hold no key)."""
    num_registered_blocks: int = 0
    """Leading blocks whose key is settled (cached, or uncached because another holder
    registered it first); every block past them is uncached."""
    num_cached_tokens: int = 0
    num_prefill_tokens_computed: int = 0
    num_preemptions: int = 0
    adapter_load_s: float = 0.0
    busy_prefill_s: float = 0.0
    """Replica seconds of its prompt (or recompute) chunks: each step's time is shared by the
    step's items in proportion to the tokens each computes."""
    busy_replay_s: float = 0.0
    """Replica seconds of its bounded replay."""
    busy_reencode_s: float = 0.0
    """Replica seconds of re-encoding the encoder window before its new tokens."""
    busy_decode_s: float = 0.0
    """Replica seconds of its decode steps: `busy_decode_units` rounded once."""
    busy_decode_units: int = 0
    """Its decode steps' shares summed exactly, in units of 2**-100 s
    (`sim.engine.decode_group.add_decode_busy`)."""
    is_replay_done: bool = False
    is_routing_done: bool = False
    first_scheduled_s: float = -1.0
    first_token_s: float = -1.0
    finish_s: float = -1.0
    replica: int = -1
    hash_key_table: tuple[int, list[range], list[int] | range] | None = field(
        default=None, repr=False)
    """(block size, key runs of every hash-id block, each run's first block), built on first use
    when the keys are computed from the ids (no manager table): a prompt's ~27 runs are then
    sliced, not recomputed, by each lookup and registration. Dropped when the sequence ends."""

    @property
    def num_tokens(self) -> int:
        """Prompt plus tokens generated so far."""
        return self.num_prompt_tokens + self.num_generated_tokens

    @property
    def is_prefilling(self) -> bool:
        """Whether prompt (or recompute) tokens remain: not a one-token decode step."""
        return self.num_generated_tokens == 0 or self.num_tokens - self.num_computed_tokens > 1

    @property
    def is_finished(self) -> bool:
        """Whether every output token (or, without outputs, the prompt) is done."""
        if self.num_output_tokens == 0:
            return self.num_computed_tokens >= self.num_prompt_tokens
        return self.num_generated_tokens >= self.num_output_tokens

    @property
    def num_stream_tokens(self) -> int:
        """Leading tokens that belong to the shared text stream (cacheable when full)."""
        if self.is_output_in_stream and self.num_stream_prompt_tokens == self.num_prompt_tokens:
            return self.num_prompt_tokens + self.num_generated_tokens
        return self.num_stream_prompt_tokens

    @property
    def is_cacheable(self) -> bool:
        """Whether any block can carry a cache key."""
        return self.stream_id != PRIVATE_STREAM or self.hash_ids is not None

    def block_key_runs(self, start: int, stop: int, block_size: int,
                       kv: KvBlockManager) -> list[range]:
        """Cache keys of blocks start..stop-1, cut at the first block holding private tokens, as
        runs of consecutive ints (one per stream, or one per trace hash id).

        Block j is named by (namespace, stream, j), or under trace hash ids by (namespace, the
        hash id covering it, j); `kv.key_base` (`kv.trace_key_bases` for many trace hash ids)
        turns a name into the key of its block 0."""
        stop = min(stop, self.num_stream_tokens // block_size)
        if stop <= start:
            return []
        ns = self.kv_namespace
        if self.hash_ids is None:
            if self.stream_id == PRIVATE_STREAM:
                return []
            base = kv.key_base(ns, self.stream_id)
            return [range(base + start, base + stop)]
        ids, per_id = self.hash_ids, self.hash_block_tokens
        num_id_blocks = -(-len(ids) * per_id // block_size)
        stop = min(stop, num_id_blocks)
        if stop <= start:
            return []
        table = self.hash_key_table
        if table is None or table[0] != block_size:
            runs, is_computed = _hash_key_runs(ids, per_id, ns, block_size, kv)
            firsts = list(itertools.accumulate(map(len, runs[:-1]), initial=0))
            table = (block_size, runs, firsts)
            if is_computed:  # numbered keys are the manager's, in use order: not kept
                self.hash_key_table = table
        _, runs, firsts = table
        low, high = bisect_right(firsts, start) - 1, bisect_left(firsts, stop)
        cut = runs[low:high]  # the runs holding blocks start..stop-1, cut at both ends
        cut[0] = range(cut[0].start + start - firsts[low], cut[0].stop)
        cut[-1] = range(cut[-1].start, runs[high - 1].start + stop - firsts[high - 1])
        return cut


def _hash_key_runs(ids: tuple[int, ...], per_id: int, ns: int, block_size: int,
                   kv: KvBlockManager) -> tuple[list[range], bool]:
    """Key runs of all the ids' blocks, and whether every key was computed from its name.

    Block j is named (ns, id covering its first token, j). The id's position p in the prompt
    is a function of j (the block size and the hash block size are fixed in one KV pool), so
    the name is also (ns, id - p, j): keyed under run id - p, consecutive ids at consecutive
    positions (most of a trace's prompt) share a run and their blocks one range of keys, while
    keys stay equal exactly where names are."""
    kv.check_hash_block_tokens(per_id)
    if per_id % block_size == 0:  # each hash id covers whole blocks (the usual case)
        per = per_id // block_size
        pairs = zip(range(1, len(ids)), ids[:-1], ids[1:], strict=True)
        firsts = [0] + [p for p, before, name in pairs if name != before + 1]  # id - p changes
        diagonals = [ids[p] - p for p in firsts]
        bases = kv.trace_key_bases(ns, diagonals)
        runs = [range(base + first * per, base + last * per)
                for base, first, last in zip(bases, firsts, [*firsts[1:], len(ids)], strict=True)]
        return runs, kv.computes_trace_keys(ns, diagonals)
    runs, diagonals = [], []
    j, stop = 0, -(-len(ids) * per_id // block_size)
    while j < stop:
        position = j * block_size // per_id
        end = min(stop, -(-(position + 1) * per_id // block_size))  # past its hash id
        diagonal = ids[position] - position
        if diagonals and diagonals[-1] == diagonal:  # the run goes on
            runs[-1] = range(runs[-1].start, runs[-1].stop + end - j)
        else:
            base = kv.key_base(ns, diagonal, True)
            runs.append(range(base + j, base + end))
            diagonals.append(diagonal)
        j = end
    return runs, kv.computes_trace_keys(ns, diagonals)
