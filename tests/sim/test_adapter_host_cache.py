"""The host adapter cache (max_cpu_loras): a cold load (adapter not cached) pays the read into
the cache and then the host-to-device copy, a warm load only the copy; the cache's LRU
eviction makes an adapter cold again; the load blocks the step that admits the sequence."""

import numpy as np
import pytest
from sim_configs import small_config

from sim.cost.cost_model import CostCoeffs, adapter_disk_load_s
from sim.memory.adapter_slots import AdapterSlots
from sim.simulate import simulate
from sim.workload.generate import single_turn_workload

H2D = [0.1, 0.2, 0.3]
DISK = [1.0, 2.0, 4.0]


def _cycle(slots: AdapterSlots, adapter: int) -> float:
    seconds = slots.activate(adapter)
    slots.release(adapter)
    return seconds


def test_cold_then_warm_then_evicted_cold_again():
    slots = AdapterSlots(max_loras=1, max_cpu_loras=2, load_s=H2D, disk_load_s=DISK)
    assert _cycle(slots, 0) == 1.0 + 0.1  # cold: read into the cache, then copied
    assert _cycle(slots, 1) == 2.0 + 0.2  # cold; takes adapter 0's only slot
    assert slots.is_cached(0) and _cycle(slots, 0) == 0.1  # warm: cached, not in a slot
    # Adapter 2 is cold and fills the 2-entry cache: it evicts its least recently used
    # entry, adapter 1 (0 was used since), whose next load is cold again.
    assert _cycle(slots, 2) == 4.0 + 0.3
    assert not slots.is_cached(1) and slots.is_cached(0)
    assert _cycle(slots, 1) == 2.0 + 0.2
    assert (slots.num_loads, slots.num_cold_loads) == (5, 4)


def test_resident_adapter_loads_nothing_and_no_disk_prices_cold_as_warm():
    slots = AdapterSlots(max_loras=2, max_cpu_loras=2, load_s=H2D, disk_load_s=DISK)
    assert slots.activate(0) == 1.1 and slots.activate(0) == 0.0
    plain = AdapterSlots(max_loras=2, max_cpu_loras=2, load_s=H2D)
    assert plain.activate(0) == 0.1 and plain.num_cold_loads == 1


def test_preloaded_cache_starts_warm_up_to_its_capacity():
    slots = AdapterSlots(max_loras=1, max_cpu_loras=2, load_s=H2D, disk_load_s=DISK,
                         num_preloaded=3)
    assert [slots.is_cached(a) for a in range(3)] == [True, True, False]
    assert _cycle(slots, 1) == 0.2 and _cycle(slots, 0) == 0.1
    assert _cycle(slots, 2) == 4.3  # beyond max_cpu_loras: not preloaded


def test_disk_load_price_is_overhead_plus_bytes_over_read_rate():
    c = CostCoeffs(adapter_disk_load_overhead_s=0.045, adapter_disk_read_s_per_gib=0.6)
    assert adapter_disk_load_s(c, 2**30) == pytest.approx(0.645, rel=1e-12)
    assert adapter_disk_load_s(CostCoeffs(), 2**30) == 0.0  # unfitted: no host-cache cost


@pytest.mark.parametrize("mode", ["reference", "fast"])
def test_cold_load_blocks_the_admitting_step(mode):
    """vLLM loads a request's adapter in the model runner before the step's forward pass, so
    the whole step waits: one request's TTFT grows by exactly the cold load's read."""
    coeffs = CostCoeffs(adapter_disk_load_overhead_s=0.25, adapter_disk_read_s_per_gib=2.0)
    ttft = {}
    for preload in (True, False):
        config = small_config("multi_lora", mode=mode, preload_cpu_loras=preload)
        config = config.model_copy(update={"coeffs": coeffs})
        workload = single_turn_workload(np.zeros(1), np.array([64]), np.array([4]),
                                        np.zeros(1, int))
        ttft[preload] = simulate(config, workload).turns.iloc[0].ttft_s
    num_bytes = config.strategy.adapters[0].num_bytes_per_gpu
    assert ttft[False] - ttft[True] == pytest.approx(adapter_disk_load_s(coeffs, num_bytes),
                                                     rel=1e-9)
