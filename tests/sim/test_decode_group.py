"""The engine's decode group (`sim.engine.decode_group`) plans and commits exactly what walking
every running sequence does: same steps, same blocks, same finishes, same float seconds."""

import numpy as np
import pytest

from sim.config import EngineLimits
from sim.cost.cost_model import attention_s_per_item
from sim.engine import step_pricer
from sim.engine.decode_group import SHARE_SCALE, DecodeGroup, add_decode_busy, share_units
from sim.engine.replica import _attribute
from sim.engine.scheduler import Engine
from sim.engine.sequence import Sequence
from sim.engine.step_pricer import StepPricer

SCENARIOS = {
    # name: (engine limits, KV blocks, longest prompt)
    "roomy": (dict(max_num_seqs=12, max_num_batched_tokens=400), 4000, 200),
    "chunked": (dict(max_num_seqs=16, max_num_batched_tokens=64), 4000, 200),
    "tight kv": (dict(max_num_seqs=16, max_num_batched_tokens=256), 60, 200),
    "speculative": (dict(max_num_seqs=8, max_num_batched_tokens=128, num_speculative_tokens=3,
                         mean_accepted_tokens=2.6, block_size=4), 480, 200),
    # Short prompts finish within a step's last few tokens: more decodes than the budget holds.
    "decodes over budget": (dict(max_num_seqs=24, max_num_batched_tokens=32,
                                 num_speculative_tokens=3, mean_accepted_tokens=2.0), 4000, 6),
    "no prefix cache": (dict(max_num_seqs=10, max_num_batched_tokens=96,
                             enable_prefix_caching=False), 80, 200),
}


def _sequences(rng, n, max_prompt):
    seqs = []
    for i in range(n):
        prompt = int(rng.integers(1, max_prompt))
        seqs.append(Sequence(
            seq_id=i, hop="answer", adapter=int(rng.integers(-1, 3)), kv_namespace=-1,
            num_prompt_tokens=prompt, num_output_tokens=int(rng.integers(1, 50)), submit_s=0.0,
            stream_id=int(rng.integers(0, 3)), num_stream_prompt_tokens=prompt,
            is_decode_adapted=bool(rng.integers(0, 2))))
    return seqs


def _drive(seed: int, limits: dict, num_blocks: int, max_prompt: int, *, walk: bool,
           monkeypatch) -> list:
    """Run 60 sequences through one engine, arrivals and run lengths drawn from `seed`; every
    step's plan and outcome, then every sequence's fields. `walk`: never use the group."""
    if walk:
        monkeypatch.setattr(Engine, "_schedule_group", lambda self, plan, budget: None)
    else:
        monkeypatch.undo()
    rng = np.random.default_rng(seed)
    engine = Engine(EngineLimits(**limits), num_blocks, [0.0, 0.0, 0.0], check_invariants=True)
    seqs = _sequences(rng, 60, max_prompt)
    waiting, log, now = list(seqs), [], 0.0
    while waiting or engine.num_outstanding:
        for _ in range(int(rng.integers(0, 3))):
            if waiting:
                engine.add(waiting.pop(0))
        if not engine.num_outstanding:
            continue
        plan = engine.schedule(now)
        free_planned = engine.kv.num_free
        num_steps = 1
        if plan.is_pure_decode:  # a run cut anywhere, as an arrival would
            num_steps = int(rng.integers(1, engine.max_decode_run_steps(plan) + 1))
        elapsed = float(rng.random())
        now += elapsed
        _attribute(plan, elapsed, engine.num_decode_compute_tokens)
        contexts = StepPricer.decode_contexts(plan).tolist()
        finished = engine.commit(plan, num_steps, now)
        log.append(([(s.seq_id, n) for s, n in plan.prefills], [s.seq_id for s in plan.decodes],
                    contexts, free_planned, num_steps, plan.num_preempted,
                    [s.seq_id for s in finished],
                    engine.kv.num_free, [s.num_blocks for s in engine.running]))
    log.append([(s.num_generated_tokens, s.num_computed_tokens, s.busy_decode_s,
                 s.busy_prefill_s, s.first_token_s, s.finish_s, s.num_preemptions)
                for s in seqs])
    return log


@pytest.mark.parametrize("name", SCENARIOS)
@pytest.mark.parametrize("seed", (0, 1))
def test_group_plans_and_commits_what_walking_the_batch_does(name, seed, monkeypatch):
    walked = _drive(seed, *SCENARIOS[name], walk=True, monkeypatch=monkeypatch)
    grouped = _drive(seed, *SCENARIOS[name], walk=False, monkeypatch=monkeypatch)
    assert len(grouped) == len(walked)
    for step, (got, expected) in enumerate(zip(grouped, walked, strict=True)):
        assert got == expected, f"step {step}"  # floats too: equal, not close


def test_group_is_used_and_members_follow_the_counter():
    # Three decoding sequences joined at different ticks: their fields come back from the
    # counter, blocks grow when computed tokens pass a block edge, finishes come in order.
    group = DecodeGroup(block_size=4, tokens_per_step=1)
    seqs = []
    for i, (prompt, out) in enumerate(((5, 3), (3, 6), (8, 3))):
        seq = Sequence(seq_id=i, hop="answer", adapter=i - 1, kv_namespace=-1,
                       num_prompt_tokens=prompt, num_output_tokens=out, submit_s=0.0,
                       num_computed_tokens=prompt, num_generated_tokens=1)
        seq.num_blocks = -(-prompt // 4)
        seqs.append(seq)
    group.join(seqs[2], order=2)
    group.join(seqs[0], order=0)
    group.add_share(0.5)  # before seqs[1] joins: not its share
    group.join(seqs[1], order=1)
    assert group.members == seqs and group.adapters == {0: 1, 1: 1} and group.num_adapted == 2
    assert group.min_remaining() == 2
    added, done = group.advance(1)
    group.add_share(0.25)
    assert (added, done) == (1, [])  # seqs[2] reaches 9 computed tokens: a third block
    assert [s.num_blocks for s in seqs] == [2, 1, 3]
    added, done = group.advance(1)
    assert added == 1 and done == [seqs[0], seqs[2]]  # seqs[1] reaches 5 computed: 2 blocks
    for seq in done:
        group.leave(seq)
    assert (seqs[0].num_generated_tokens, seqs[0].num_computed_tokens) == (3, 7)
    assert seqs[0].busy_decode_s == 0.75 and seqs[2].busy_decode_s == 0.75
    assert group.members == [seqs[1]] and group.adapters == {0: 1}
    group.dissolve()
    assert (seqs[1].num_generated_tokens, seqs[1].num_computed_tokens) == (3, 5)
    assert seqs[1].busy_decode_s == 0.25 and not group.members


def _decoding(seq_id: int) -> Sequence:
    seq = Sequence(seq_id=seq_id, hop="answer", adapter=-1, kv_namespace=-1,
                   num_prompt_tokens=4, num_output_tokens=100, submit_s=0.0,
                   num_computed_tokens=4, num_generated_tokens=1)
    seq.num_blocks = 1
    return seq


def test_decode_busy_time_is_the_exact_sum_of_its_shares_rounded_once():
    # 1 + 2**-53 rounds back to 1 (ties to even): adding the shares one by one gives 1.0 twice
    # over; their exact sum 1 + 2**-52 is a float. Shares added one at a time or as a run's
    # array, inside the group or outside it, give the same busy time, and a member counts only
    # the shares since it joined.
    tiny = 2.0**-53
    seqs = [_decoding(i) for i in range(3)]
    again = [_decoding(i) for i in range(3)]
    one_by_one, as_a_run = DecodeGroup(16, 1), DecodeGroup(16, 1)
    for group, (a, b, c) in ((one_by_one, seqs), (as_a_run, again)):
        group.join(a, order=0)
        group.add_share(1.0)
        group.join(b, order=1)
        if group is one_by_one:
            group.add_share(tiny)
            group.add_share(tiny)
        else:
            group.add_share(np.array([tiny, tiny]))
        group.join(c, order=2)
        group.add_share(0.25)
        group.dissolve()
    assert seqs[0].busy_decode_s == 1.0 + 2.0**-52 + 0.25
    assert seqs[1].busy_decode_s == 2.0**-52 + 0.25 and seqs[2].busy_decode_s == 0.25
    assert [s.busy_decode_s for s in again] == [s.busy_decode_s for s in seqs]
    outside = _decoding(0)  # the same shares outside any group
    for share in (1.0, tiny, tiny, 0.25):
        add_decode_busy(outside, share_units(share))
    assert outside.busy_decode_s == seqs[0].busy_decode_s


@pytest.mark.parametrize("field", ("num_computed_tokens", "first_layer", "last_layer"))
@pytest.mark.parametrize("num_chunks", (1, 3, 40))
@pytest.mark.parametrize("cache_size", (None, 4))
def test_prompt_chunk_prices_are_cached_by_all_they_depend_on(field, num_chunks, cache_size,
                                                              monkeypatch):
    # Steps of prompt chunks of 64 + 7 i tokens, every other chunk differing in one field from the
    # last step's: those may not reuse another's attention. The fast pricer's sum over cached items
    # must be the one of pricing them together, bit for bit; the step-by-step pricer agrees.
    from sim_configs import small_config

    from sim.engine.step_plan import StepPlan
    from sim.simulate import create_profile

    if cache_size:  # a full cache is cleared mid-step
        monkeypatch.setattr(step_pricer, "MAX_CACHED_CHUNKS", cache_size)
    config = small_config("multi_lora")
    profile = create_profile(config)
    pricers = [StepPricer(config.coeffs, profile, replay_first_layer=0,
                          num_decode_compute_tokens=1, num_tokens_per_decode_step=1,
                          is_fast=is_fast) for is_fast in (True, False)]
    values = {"num_computed_tokens": (0, 512), "first_layer": (0, 4),
              "last_layer": (-1, profile.num_layers // 2)}[field]
    for value in values:
        seqs = [Sequence(seq_id=i, hop="answer", adapter=0, kv_namespace=0,
                         num_prompt_tokens=4096, num_output_tokens=4, submit_s=0.0,
                         num_computed_tokens=100 * i) for i in range(num_chunks)]
        for seq in seqs[1::2]:  # the even ones stay as in the last step: cached
            setattr(seq, field, value + (100 * seq.seq_id if field == "num_computed_tokens"
                                         else 0))
        plan = StepPlan(prefills=[(seq, 64 + 7 * seq.seq_id) for seq in seqs])
        fast, reference = (pricer.step_s(plan) for pricer in pricers)
        assert fast == reference
        together = float(attention_s_per_item(
            config.coeffs, profile, 64 + 7 * np.arange(num_chunks),
            np.array([s.num_computed_tokens for s in seqs]),
            np.array([s.first_layer for s in seqs]),
            np.array([profile.num_layers if s.last_layer < 0 else s.last_layer for s in seqs]),
        ).sum())
        assert pricers[0]._attention_s(plan) == together


def _group_state(group: DecodeGroup, ticks: int) -> list:
    """The group's layout, then what advancing it tick by tick gives (blocks, finishes)."""
    state = [list(group.members), list(group.orders), list(group.context_offsets),
             dict(group.adapters), group.num_adapted]
    for _ in range(ticks):
        added, done = group.advance(1)
        state.append((added, [s.seq_id for s in done]))
        for seq in done:
            group.leave(seq)
    return state


def test_joining_a_batch_at_once_lays_it_out_as_joining_one_by_one():
    # After a dissolve the whole batch joins an empty group at once (join_all), in plan order
    # rather than running order: the layout and the heaps must be those of one-by-one joins.
    states = []
    for at_once in (False, True):
        rng = np.random.default_rng(4)
        seqs = _sequences(rng, 40, 200)
        for seq in seqs:
            seq.num_blocks = -(-seq.num_prompt_tokens // 16)
            seq.num_computed_tokens = seq.num_prompt_tokens
            seq.num_generated_tokens = 1
        orders = [int(o) for o in rng.permutation(1000)[:40]]
        group = DecodeGroup(block_size=16, tokens_per_step=1)
        if at_once:
            group.join_all(seqs, orders)
        else:
            for seq, order in zip(seqs, orders, strict=True):
                group.join(seq, order)
        states.append(_group_state(group, 60))
    ids = [[s.seq_id for s in state[0]] for state in states]
    assert ids[0] == ids[1] and states[0][1:] == states[1][1:]


@pytest.mark.parametrize("size", (1, 63, 64, 127, 1024, 1025))
def test_share_units_of_an_array_is_each_shares_units_summed(size):
    # Long arrays go through their floats' mantissas and exponents (a share under 2**-47 s
    # has bits below the unit: those arrays go share by share).
    rng = np.random.default_rng(size)
    for low, high in ((-5, -2), (-20, 3), (-14.5, -14.4), (-60, -40)):
        seconds = rng.random(size) * 10.0 ** rng.uniform(low, high, size)
        seconds[size // 2] = 0.0
        assert share_units(seconds) == sum(int(s * SHARE_SCALE) for s in seconds.tolist())
