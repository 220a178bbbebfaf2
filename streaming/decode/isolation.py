"""Decoding a batch again after it crashed a Python worker, so that no record can stop the stream.

The decoder refuses every input it knows to be dangerous before native code sees it (nesting
deeper than GEOS's stack, curves shapely cannot hold, ...). A record that still crashes GEOS or
Arrow kills the Python worker, fails the micro-batch, and would fail it again on every replay. When
that happens the job decodes the batch once more with this decoder: each part in a child process,
halved after every crash until the record is found, which then becomes a decode_failed reject and
goes to the dead-letter topic like any other. Slow (a child process per crash), and used only for a
batch that crashed.
"""

from __future__ import annotations

import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import pyarrow as pa

from streaming.contract import Contract
from streaming.decode.decoder import DecodeOptions, Decoder

log = logging.getLogger("geoingest.isolation")

# The marker Spark puts in the error of a task whose Python worker died.
WORKER_CRASHED = "Python worker exited unexpectedly (crashed)"

_child_decoder: Decoder | None = None


class IsolatedDecoder:
    """Decoder.decode, run in a child process; a batch that crashes it is halved until the
    crashing records are alone, and those are rejected as decode_failed."""

    def __init__(self, contract: Contract, options: DecodeOptions | None = None):
        self._contract = contract
        self._options = options or DecodeOptions()
        self._decoder = Decoder(contract, self._options)
        self._pool: ProcessPoolExecutor | None = None

    def decode(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        try:
            return self._child().submit(_decode_in_child, batch).result()
        except BrokenProcessPool:
            self._pool = None
        if batch.num_rows == 1:
            log.warning(
                "a record crashed the decoder; dead-lettered as decode_failed",
                extra={"summary": {"record": _where(batch)}},
            )
            return self._decoder.failed(
                batch,
                "the decoder crashed on this record (its process died): a defect in native code met by this input",
            )
        half = batch.num_rows // 2
        parts = [self.decode(batch.slice(0, half)), self.decode(batch.slice(half))]
        return pa.Table.from_batches(parts, schema=self._decoder.schema).combine_chunks().to_batches()[0]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _child(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the worker holds Arrow's thread pools and the JVM's socket
            self._pool = ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_child,
                initargs=(self._contract, self._options),
            )
        return self._pool


def _start_child(contract: Contract, options: DecodeOptions) -> None:
    global _child_decoder
    _child_decoder = Decoder(contract, options)


def _decode_in_child(batch: pa.RecordBatch) -> pa.RecordBatch:
    if _child_decoder is None:
        raise RuntimeError("the decoder process has no decoder: _start_child, its initializer, did not run")
    return _child_decoder.decode(batch)


def _where(batch: pa.RecordBatch) -> str:
    names = batch.schema.names
    if {"topic", "partition", "offset"} <= set(names):
        return f"{batch.column('topic')[0]}/{batch.column('partition')[0]}/{batch.column('offset')[0]}"
    return "?"


def worker_crashed(error: BaseException) -> bool:
    return WORKER_CRASHED in str(error)
