"""starwire from Python: the tensor transport of parameter-server training, over its C ABI.

A `Runtime` runs the event loops (use it as a context manager); a PS passes ``listen`` and
what it serves (a `PsTable`, starwire's PS table, saved and loaded as checkpoints; a
`RowsTable` kept in Python; a per-tensor `Service`). A
`Client` per thread sends requests: ping, pull/push of tensors, recv/recv_many of published
tensors, rows (`Client.pull_rows`, `Client.push_rows`), the sharded rows client
(`Client.sharded`; `Pipeline`, its pipelined form: the next batch's rows fetched while
this one computes, pushes not waited for, a staleness bound; `ShardedTables`, several
tables in one request per PS, and `PipelineTables`, several tables pipelined together), and checkpoints of a PS's tables into its own directory
(`Client.checkpoint`; `Runtime(checkpoint_dir=...)` on the PS). Each request has a blocking form and a submitted one (``submit_*``,
returning a `Pending`); waiting releases the GIL.

Arrays cross without copies: a received tensor or row block is a numpy array over the
memory its payload was received into, and an array pushed or published is sent from its
own memory. Failures raise `StarwireError` subclasses (see `starwire.errors`).

    import numpy as np, starwire

    table = starwire.PsTable(16, table_id=0, init="uniform", scale=0.1)
    with starwire.Runtime("ps", listen="127.0.0.1:0", tables={0: table}) as ps, \\
            starwire.Runtime("worker") as worker:
        client = worker.client()
        rows, missing = client.pull_rows(ps.address, 0, np.arange(4, dtype=np.uint64), 16)
"""

from . import _lib
from .client import DEFAULT_TIMEOUT, Client, Pending, Sharded, StepReport, VersionedRows
from .errors import (ABORTED, CANCELLED, DEADLINE_EXCEEDED, INTERNAL, INVALID_ARGUMENT,
                     NOT_FOUND, OK, PROTOCOL, RESOURCE_EXHAUSTED, SHUTDOWN, UNAVAILABLE,
                     UNIMPLEMENTED, AlreadyPublished, Backpressure, CheckpointCorrupted,
                     CheckpointError, CheckpointIoError, CheckpointShapeError,
                     CheckpointTableError, CheckpointTruncated, CheckpointVersionError,
                     Closed, ConfigError, ConnectFailed, ConnectionLost, InternalError,
                     InvalidArgument, IoError, NotACheckpoint, ProtocolError, Refused,
                     RemoteError, Shutdown, StarwireError, TableFull, Timeout, status_name)
from .metrics import Metrics, remote_stats
from .pipeline import Pipeline, PipelineReport, PipelineSettings, PipelineTables, PushFailure
from .ps_table import (HotId, LoadReport, MaintainReport, PsTable, SaveReport, TableMetrics,
                       checkpoint_file)
from .runtime import Allocator, MemTable, RowsTable, Runtime, Service
from .sharded_tables import ShardedTables

Stats = _lib.Stats


def version() -> str:
    """The native library's version."""
    return (_lib.version() or b"").decode()


def library_path() -> str:
    """Where the native library was loaded from."""
    return _lib.library_path()


__all__ = [
    "ABORTED", "CANCELLED", "DEADLINE_EXCEEDED", "DEFAULT_TIMEOUT", "INTERNAL",
    "INVALID_ARGUMENT", "NOT_FOUND", "OK", "PROTOCOL", "RESOURCE_EXHAUSTED", "SHUTDOWN",
    "UNAVAILABLE", "UNIMPLEMENTED", "AlreadyPublished", "Allocator", "Backpressure",
    "CheckpointCorrupted", "CheckpointError", "CheckpointIoError", "CheckpointShapeError",
    "CheckpointTableError", "CheckpointTruncated", "CheckpointVersionError", "Client",
    "Closed", "ConfigError", "ConnectFailed", "ConnectionLost", "HotId", "InternalError",
    "InvalidArgument", "IoError", "LoadReport", "MaintainReport", "MemTable", "Metrics",
    "NotACheckpoint", "Pending", "Pipeline", "PipelineReport", "PipelineSettings",
    "PipelineTables", "ProtocolError", "PsTable", "PushFailure", "Refused", "RemoteError",
    "RowsTable", "Runtime", "SaveReport", "Service", "Sharded", "ShardedTables", "Shutdown",
    "StarwireError",
    "Stats", "StepReport", "TableFull", "TableMetrics", "Timeout", "VersionedRows",
    "checkpoint_file",
    "library_path", "remote_stats", "status_name", "version",
]
