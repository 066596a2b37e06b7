"""Guards: each refusal simulated (untested vLLM, changed internals, V2 runner, no eager mode),
with its one log line, its counter, and requests that need the feature refused at the front end.
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import torch
from vllm_helpers import save_adapter, tiny_llama

from engine_ext.reft import ReftSpec, random_reft
from engine_ext.reft_io import save_reft_adapter
from engine_ext.vllm_plugin import frontend, guards
from engine_ext.vllm_plugin.config import ConfigWatcher
from engine_ext.vllm_plugin.counters import sum_counters
from engine_ext.vllm_plugin.runtime import HASH_KEY, reset_state


def _processor(*, v2: bool, eager: bool, model_dir: str = "/m", max_rank: int = 8):
    """The attributes of vLLM's InputProcessor the front-end checks read."""
    compilation = SimpleNamespace(mode=0 if eager else 3,
                                  cudagraph_mode=SimpleNamespace(name="NONE" if eager else "FULL"))
    model_config = SimpleNamespace(enforce_eager=eager, model=model_dir,
                                   hf_config=SimpleNamespace(num_hidden_layers=4),
                                   get_hidden_size=lambda: 256)
    vllm_config = SimpleNamespace(use_v2_model_runner=v2, compilation_config=compilation,
                                  model_config=model_config)
    return SimpleNamespace(vllm_config=vllm_config, model_config=model_config,
                           lora_config=SimpleNamespace(max_lora_rank=max_rank))


@pytest.fixture()
def fresh(tmp_path):
    """A plugin state of its own (own refusals, own counter folder)."""
    config = tmp_path / "plugin.json"
    config.write_text(json.dumps({"counter_dir": str(tmp_path / "counters")}))
    state = reset_state(ConfigWatcher(config), guards.Support())
    yield state, tmp_path / "counters"
    reset_state()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("guard_adapters")
    model = tiny_llama(root / "model")
    reft = random_reft(ReftSpec(rank=4, layers=(1, 2)), 256, torch.Generator().manual_seed(0))
    return dict(
        lora=str(save_adapter(model, root / "lora", seed=1, prefill_only=False)),
        lora_p=str(save_adapter(model, root / "lora_p", seed=1, prefill_only=True)),
        direft_p=str(save_reft_adapter(reft, root / "direft_p")),
    )


def _request(path: str):
    return SimpleNamespace(lora_name=path.rsplit("/", 1)[-1], lora_path=path)


def test_untested_version_refuses_every_feature():
    refused = guards.registration_refusals("0.31.9")
    assert set(refused) == set(guards.FEATURES)
    assert "vLLM 0.31.9 is untested (tested: 0.32.0)" in refused[guards.PREFILL_ONLY]
    assert guards.registration_refusals("0.32.0") == {}  # the installed vLLM passes every check


def test_changed_or_missing_internals_refuse_the_features_that_patch_them():
    changed = guards.Internal("json", "dumps", ("obj", "indent"), (guards.ROUTING,))
    missing = guards.Internal("json", "JSONEncoder.no_such_method", ("self",),
                              (guards.DIREFT, guards.PREFILL_ONLY))
    fine = guards.Internal("json", "dumps", ("obj",), (guards.ROUTED_DECODE,))
    refused = guards.internals_refusals({i: guards.internal_problem(i)
                                         for i in (changed, missing, fine)})
    assert set(refused) == {guards.ROUTING, guards.DIREFT, guards.PREFILL_ONLY}
    assert "json.dumps takes ('obj', 'skipkeys'" in refused[guards.ROUTING]
    assert "JSONEncoder.no_such_method is missing" in refused[guards.DIREFT]


def test_v2_runner_refuses_everything_and_compiled_models_refuse_the_layer_hooks():
    v2 = guards.runner_refusals(guards.RunnerFacts(v2_runner=True, eager=True))
    assert set(v2) == set(guards.FEATURES) and "VLLM_USE_V2_MODEL_RUNNER=0" in v2[guards.DIREFT]
    compiled = guards.runner_refusals(guards.RunnerFacts(v2_runner=False, eager=False))
    assert set(compiled) == {guards.DIREFT, guards.ROUTING}
    assert "--enforce-eager" in compiled[guards.ROUTING]
    assert guards.runner_refusals(guards.RunnerFacts(v2_runner=False, eager=True)) == {}
    facts = guards.runner_facts(_processor(v2=False, eager=False).vllm_config)
    assert facts == guards.RunnerFacts(v2_runner=False, eager=False)


def test_a_refusal_logs_one_line_and_is_counted(fresh, caplog):
    state, counters = fresh
    with caplog.at_level(logging.ERROR):
        state.refuse(guards.ROUTING, "reason one")
        state.refuse(guards.ROUTING, "reason two")  # already refused: no second line
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert lines == ["molcap plugin: routing refused: reason one"]
    (process,) = sum_counters(counters).per_process
    assert process["refused"] == {guards.ROUTING: "reason one"}


def test_v2_front_end_rejects_prefill_only_and_direft_requests(fresh, adapters):
    state, counters = fresh
    validate = frontend._make_validate_lora(lambda self, request: None)
    processor = _processor(v2=True, eager=True)
    for kind in ("lora_p", "direft_p"):
        with pytest.raises(frontend.PluginRequestError, match="Model Runner V2"):
            validate(processor, _request(adapters[kind]))
    validate(processor, _request(adapters["lora"]))  # all-token LoRA: vLLM serves it as is
    validate(processor, None)
    totals = sum_counters(counters)
    assert totals.counts["rejected"] == 2
    assert set(totals.per_process[0]["refused"]) == set(guards.FEATURES)


def test_compiled_front_end_rejects_direft_but_serves_lora_p(fresh, adapters):
    state, _ = fresh
    validate = frontend._make_validate_lora(lambda self, request: None)
    processor = _processor(v2=False, eager=False)
    validate(processor, _request(adapters["lora_p"]))
    with pytest.raises(frontend.PluginRequestError, match="needs direft.*--enforce-eager"):
        validate(processor, _request(adapters["direft_p"]))


def test_decision_hash_rejected_where_routed_decode_is_refused(fresh):
    state, counters = fresh
    validate = frontend._make_validate_params(lambda self, params, *args: None)
    params = SimpleNamespace(extra_args={HASH_KEY: 123})
    validate(_processor(v2=False, eager=False), params, ())  # V1 compiled: decode side works
    with pytest.raises(frontend.PluginRequestError, match="routing decision"):
        validate(_processor(v2=True, eager=True), params, ())
    assert sum_counters(counters).counts["rejected"] == 1


def test_a_chunked_prompt_is_not_routed_loudly_without_the_scheduler_in_process(fresh, caplog):
    from engine_ext.vllm_plugin.patches import _route_plan

    state, counters = fresh
    state.scheduler_here = False  # e.g. tensor parallel: workers in their own processes
    assert _route_plan(state, 0, "first-chunk", 0, 0, 300, 256).final is False
    with caplog.at_level(logging.WARNING):
        assert _route_plan(state, 0, "r", 0, 256, 300, 44) is None
        assert _route_plan(state, 1, "r2", 0, 256, 300, 44) is None
    warnings = [r.getMessage() for r in caplog.records if "not routed" in r.getMessage()]
    assert len(warnings) == 1 and "scheduler runs in another process" in warnings[0]
    assert sum_counters(counters).counts["unrouted"] == 2
    state.scheduler_here = True
    plan = _route_plan(state, 0, "r3", 10, 256, 300, 44)
    assert (plan.final, plan.whole, plan.token_start, plan.token_end) == (True, False, 10, 54)
