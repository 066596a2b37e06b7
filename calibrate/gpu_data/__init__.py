"""Importers of public real-GPU serving measurements into typed records.

One module per dataset; each `import_<dataset>(folder) -> ImportResult` returns frozen records
by kind, every record naming its source file and line. `export.import_dataset(name, data_root)`
finds a dataset under a data root ($MOLCAP_DATA_DIR, or the repository's data/ slices) and
`export.write_records` writes parquet + CSV; `python -m calibrate.gpu_data DATASET --out OUT`
does both.

agullo-dt (`agullo`): `serving_run`, `test_run`, `sweep_run` (ServingRunRecord), `engine_sample`,
`scheduler_step`, `adapter_load`, `memory_probe`; `agullo_steps.decode_step_samples` turns the
decode sweeps into `calibrate.recorder.StepSample`s.
memory-gap (`memory_gap`): `serving_run`, `forward_interval`, `phase_timing`.
vidur (`vidur`): `operator_time`, `collective_time`.
llmservingsim-profiles (`llmservingsim`): `layer_time`, `attention_time`.
splitwise (`splitwise`): `phase_time`.
`steps` turns Splitwise records and memory-gap decode phases into StepSamples.
"""
