"""Column-oriented record tables: rows buffered as tuples, packed into numpy chunks, turned into
DataFrames after the run.

A million-row table stays a few hundred bytes per row instead of a Python object per value.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

CHUNK_ROWS = 65_536


class RecordTable:
    """Rows of fixed columns of int64 or float64."""

    def __init__(self, columns: dict[str, str]):
        """`columns`: name -> 'd' (float64) or 'q' (int64)."""
        self._names = tuple(columns)
        self._dtype = np.dtype([(n, "f8" if c == "d" else "i8") for n, c in columns.items()])
        self._rows: list[tuple] = []
        self._chunks: list[np.ndarray] = []

    def _pack(self) -> None:
        if self._rows:
            self._chunks.append(np.array(self._rows, dtype=self._dtype))
            self._rows.clear()

    def append(self, *values) -> None:
        """Add one row given as arguments."""
        self._rows.append(values)
        if len(self._rows) >= CHUNK_ROWS:
            self._pack()

    def __len__(self) -> int:
        return len(self._rows) + sum(c.size for c in self._chunks)

    def to_frame(self) -> pd.DataFrame:
        """The rows as a DataFrame."""
        self._pack()
        chunks, self._chunks = self._chunks, []
        data = np.concatenate(chunks) if chunks else np.zeros(0, self._dtype)
        del chunks  # at a million rows, a third copy of the table would be the peak
        self._chunks = [data]
        return pd.DataFrame({name: data[name] for name in self._names})
