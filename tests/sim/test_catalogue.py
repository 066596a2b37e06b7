"""Catalogue: every number sourced or marked assumed; published sizes; the CED layout."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from sim.cost.model_shapes import total_params
from sim.hardware.catalogue import GPUS, MODELS, CatalogueError, get_gpu, get_model
from sim.hardware.specs import GpuSpec, ModelArch

ENTRIES = [*GPUS.values(), *MODELS.values()]


def numeric_fields(spec: BaseModel) -> list[str]:
    """Fields holding a number (or a nested layout of numbers), booleans excluded."""
    return [
        name for name, value in spec
        if isinstance(value, (int, float, BaseModel)) and not isinstance(value, bool)
    ]


@pytest.mark.parametrize("spec", ENTRIES, ids=lambda s: s.name)
def test_every_number_has_a_source_or_assumed_mark(spec):
    fields = numeric_fields(spec)
    assert fields, "an entry without numbers is not an entry"
    for name in fields:
        source = spec.sources.get(name) or spec.sources.get("*")
        assert source and source.strip(), f"{spec.name}.{name} has no source"
    # Every key of `sources` names a real field (a typo would leave the field unsourced).
    assert set(spec.sources) <= {*type(spec).model_fields, "*"}


def test_gpu_catalogue_covers_the_brief():
    assert {"H20", "H100-SXM", "H200", "A100-80GB", "cpu"} <= set(GPUS)
    assert get_gpu("cpu").sources["*"].startswith("assumed")


def test_model_catalogue_covers_the_brief():
    wanted = {"ced-40", "moe-78", "llama-3.1-8b", "llama-3.1-70b", "qwen2.5-0.5b", "smollm2-135m"}
    assert wanted <= set(MODELS)


def test_moe_78_marks_its_dimensions_assumed():
    moe = get_model("moe-78")
    assert moe.num_layers == 78
    assert moe.sources["*"].startswith("assumed")


GPU_FIELDS = dict(
    name="x", bf16_dense_flops=1e12, hbm_bytes=1e9, hbm_bandwidth_bytes_per_s=1e9,
    nvlink_bandwidth_bytes_per_s=0.0, pcie_bandwidth_bytes_per_s=1e9, price_per_hour_usd=1.0,
)


def test_spec_missing_a_source_is_rejected():
    sources = {k: "a datasheet" for k in GPU_FIELDS if k != "name"}
    GpuSpec(**GPU_FIELDS, sources=sources)  # complete: accepted
    del sources["hbm_bytes"]
    with pytest.raises(ValidationError, match="hbm_bytes"):
        GpuSpec(**GPU_FIELDS, sources=sources)


def test_spec_without_any_sources_is_rejected():
    with pytest.raises(ValidationError, match="without a source"):
        GpuSpec(**GPU_FIELDS)


def test_model_with_unsourced_nested_layout_is_rejected():
    llama = get_model("llama-3.1-8b")
    fields = {k: v for k, v in llama if k != "sources"}
    sources = {k: "config.json" for k in numeric_fields(llama)}
    ModelArch(**fields, sources=sources)
    moe = {"num_routed_experts": 8, "num_experts_per_token": 2, "expert_intermediate_size": 64,
           "num_shared_experts": 0, "num_dense_layers": 0}
    with pytest.raises(ValidationError, match="moe"):
        ModelArch(**{**fields, "moe": moe}, sources=sources)


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("llama-3.1-8b", 8.03e9),
        ("llama-3.1-70b", 70.6e9),
        ("qwen2.5-0.5b", 0.494e9),
        ("smollm2-135m", 134.5e6),
    ],
)
def test_total_params_match_published_sizes(name, published):
    assert total_params(get_model(name)) == pytest.approx(published, rel=0.01)


def test_ced_40_layout():
    ced40 = get_model("ced-40")
    ced = ced40.ced
    assert ced40.is_ced
    assert ced40.num_layers == 40
    assert ced.num_encoder_layers == 20  # encoder 0-19, decoder 20-39
    assert ced.kv_source_layers == (2, 8, 14, 20)
    assert ced.index_layers == (2, 8, 14, 20, 24, 28, 32, 36)
    assert ced.sliding_window_tokens == 128
    assert ced.routing_layer == 19  # H19
    assert ced40.hidden_size == 5120
    assert (ced40.attention, ced40.num_kv_heads, ced40.kv_lora_rank) == ("mla", 1, 512)
    assert (ced40.moe.num_routed_experts, ced40.moe.num_experts_per_token) == (384, 6)


def test_decoder_only_models_are_not_ced():
    assert not get_model("llama-3.1-8b").is_ced
    assert not get_model("moe-78").is_ced


def test_unknown_names_raise_with_the_known_ones():
    with pytest.raises(CatalogueError, match="H100-SXM"):
        get_gpu("H1000")
    with pytest.raises(CatalogueError, match="llama-3.1-8b"):
        get_model("llama-9")


def test_ced_layer_indices_must_lie_in_the_model():
    ced40 = get_model("ced-40")
    with pytest.raises(ValidationError, match="num_layers=20"):
        ced40.model_validate({**ced40.model_dump(), "num_layers": 20})
