"""The model version of the code: bump it in any change that alters simulated or planned
numbers (cost model, memory model, scheduler, search). Stored points are keyed by it, so
results cached by an older molcap are recomputed instead of reused."""

MODEL_VERSION = 27
