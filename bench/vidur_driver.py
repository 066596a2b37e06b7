"""Runs one Vidur simulation of a trace and prints one JSON line (wall seconds, predictions).

Executed by bench/bench_vidur.py with the Python of Vidur's own virtual environment (Vidur and
molcap never share an interpreter), in a working directory whose `.vidur_cache/profiling_data`
holds the offline profiles of data/vidur_profiles. Not imported by molcap.

    VENV/bin/python bench/vidur_driver.py TRACE.csv OUTPUT_DIR [--tp 2] [--native]
"""

from __future__ import annotations

import argparse
import json
import time

T_IMPORT = time.perf_counter()

from vidur.config import (  # noqa: E402  (import time is part of what we measure)
    CacheConfig,
    ClusterConfig,
    MetricsConfig,
    RandomForrestExecutionTimePredictorConfig,
    ReplicaConfig,
    SarathiSchedulerConfig,
    SimulationConfig,
    TraceRequestGeneratorConfig,
)
from vidur.simulator import Simulator  # noqa: E402
from vidur.utils.random import set_seeds  # noqa: E402


def _config(args) -> SimulationConfig:
    replica = ReplicaConfig(model_name="meta-llama/Llama-2-70b-hf", device="a100",
                            network_device="a100_dgx", tensor_parallel_size=args.tp,
                            num_pipeline_stages=1,
                            gpu_memory_utilization=args.gpu_memory_utilization)
    scheduler = SarathiSchedulerConfig(batch_size_cap=args.max_num_seqs,
                                       chunk_size=args.max_num_batched_tokens)
    cluster = ClusterConfig(num_replicas=1, replica_config=replica,
                            cache_config=CacheConfig(block_size=16),
                            replica_scheduler_config=scheduler)
    # A reduced random-forest grid (one point, 2-fold): the default 27-point 10-fold grid takes
    # hours on two shared cores. Training happens once; the fitted models are cached.
    predictor = RandomForrestExecutionTimePredictorConfig(
        model_profiling_dataset="local/llama2-70b-a100",
        network_profiling_dataset="local/a100-dgx",
        num_estimators=[100], max_depth=[16], min_samples_split=[2], k_fold_cv_splits=2,
        prediction_max_tokens_per_request=4096, prediction_max_batch_size=args.max_num_seqs,
        prediction_max_prefill_chunk_size=4096, num_training_job_threads=1,
        use_native_execution_time_predictor=args.native)
    metrics = MetricsConfig(output_dir=args.output_dir, store_plots=False,
                            enable_chrome_trace=False, store_batch_metrics=False,
                            store_utilization_metrics=False, write_json_trace=False)
    requests = TraceRequestGeneratorConfig(trace_file=args.trace, date="2024-01-01",
                                           prefill_scale_factor=1, decode_scale_factor=1,
                                           time_scale_factor=1, max_tokens=args.max_tokens)
    return SimulationConfig(seed=0, log_level="warning", cluster_config=cluster,
                            request_generator_config=requests,
                            execution_time_predictor_config=predictor, metrics_config=metrics)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trace")
    parser.add_argument("output_dir")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=640,
                        help="longest request (prompt + output): Vidur sizes its KV slots by it")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--native", action="store_true",
                        help="Vidur's C++ execution-time predictor")
    args = parser.parse_args()
    imported = time.perf_counter()
    config = _config(args)
    set_seeds(config.seed)
    simulator = Simulator(config)  # loads (or once trains) the predictors, builds the queue
    built = time.perf_counter()
    simulator.run()
    done = time.perf_counter()
    store = simulator.metric_store
    series = store._request_metrics_time_distributions  # Vidur keeps no public accessor
    frames = {k.value: v._to_df() for k, v in series.items()}
    ttft = frames["prefill_e2e_time"]["prefill_e2e_time"]
    tpot = frames["decode_time_execution_plus_preemption_normalized"][
        "decode_time_execution_plus_preemption_normalized"]
    e2e = frames["request_e2e_time"]["request_e2e_time"]
    completions = store._request_completion_metrics_time_series
    done_s = max(float(c._to_df().iloc[:, 0].max()) for c in completions.values()
                 if len(c._data_series))
    print(json.dumps(dict(
        import_s=imported - T_IMPORT, setup_s=built - imported, run_s=done - built,
        num_requests=int(len(e2e)), last_completion_s=float(done_s),
        ttft_p50_s=float(ttft.median()), ttft_p99_s=float(ttft.quantile(0.99)),
        tpot_p50_s=float(tpot.median()), tpot_mean_s=float(tpot.mean()),
        e2e_p50_s=float(e2e.median()), ttft_mean_s=float(ttft.mean()))))


if __name__ == "__main__":
    main()
