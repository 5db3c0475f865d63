"""The native library and its C ABI (ffi/include/starwire.h), declared for ctypes.

The library ships inside the package (``starwire/_native.abi3.so``, built by setuptools-rust
from the ``starwire-ffi`` crate). ``$STARWIRE_LIB`` names another build of it instead (for
working on the Rust side without reinstalling).
"""

from __future__ import annotations

import ctypes as C
import os
from typing import Any, Callable

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))


def library_path() -> str:
    """Where the native library is loaded from."""
    env = os.environ.get("STARWIRE_LIB")
    if env:
        return env
    for name in sorted(os.listdir(_HERE)):
        if name.startswith("_native") and name.endswith(".so"):
            return os.path.join(_HERE, name)
    raise ImportError(
        f"starwire's native library is not in {_HERE}: install the package with "
        "`pip install ./ffi/python` (which builds it), or set STARWIRE_LIB to a "
        "libstarwire_ffi.so built by `cargo build -p starwire-ffi`"
    )


lib = C.CDLL(library_path())

p = C.c_void_p
u64p = C.POINTER(C.c_uint64)
u32p = C.POINTER(C.c_uint32)
sizep = C.POINTER(C.c_size_t)

# Wire dtype codes and their numpy dtypes. bfloat16 (7) has no numpy dtype: received
# bfloat16 tensors come as uint16 arrays of the same bits.
DTYPES: dict[int, np.dtype[Any]] = {
    code: np.dtype(t)
    for code, t in {
        1: np.bool_, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.float16,
        7: np.uint16, 8: np.uint32, 9: np.int32, 10: np.float32, 11: np.uint64, 12: np.int64,
        13: np.float64, 14: np.complex64, 15: np.complex128,
    }.items()
}
CODES: dict[np.dtype[Any], int] = {dt: code for code, dt in DTYPES.items() if code != 7}

PULL_FN = C.CFUNCTYPE(None, p, u64p, C.c_size_t, C.POINTER(p), u32p)
PUSH_FN = C.CFUNCTYPE(None, p, u64p, C.POINTER(p), C.c_size_t, u32p)
ALLOC_FN = C.CFUNCTYPE(p, p, C.c_uint8, u64p, C.c_uint32, C.c_uint64)
RELEASE_FN = C.CFUNCTYPE(None, p, p, C.c_uint64)
# Arrays as addresses: the callbacks view them as numpy arrays.
TABLE_PULL_FN = C.CFUNCTYPE(C.c_uint32, p, p, C.c_size_t, p, C.c_uint64, p, sizep)
TABLE_PUSH_FN = C.CFUNCTYPE(C.c_uint32, p, p, C.c_size_t, p, C.c_uint64)


class Service(C.Structure):
    _fields_ = [("user_data", p), ("pull", PULL_FN), ("push", PUSH_FN)]


class Allocator(C.Structure):
    _fields_ = [("user_data", p), ("allocate", ALLOC_FN), ("release", RELEASE_FN)]


class TableCallbacks(C.Structure):
    _fields_ = [("user_data", p), ("pull", TABLE_PULL_FN), ("push", TABLE_PUSH_FN)]


class Options(C.Structure):
    _fields_ = [
        ("job", C.c_char_p), ("task_index", C.c_uint32),
        ("setting_names", C.POINTER(C.c_char_p)), ("setting_values", C.POINTER(C.c_char_p)),
        ("settings", C.c_size_t), ("use_env", C.c_bool), ("listen", C.c_char_p),
        ("service", C.POINTER(Service)), ("allocator", C.POINTER(Allocator)),
        ("handler_threads", C.c_uint32),
        ("table_ids", u32p), ("tables", C.POINTER(p)), ("n_tables", C.c_size_t),
    ]


class Init(C.Structure):
    _fields_ = [("kind", C.c_uint32), ("scale", C.c_float), ("seed", C.c_uint64)]


class Optimizer(C.Structure):
    _fields_ = [("kind", C.c_uint32), ("lr", C.c_float), ("initial_accumulator", C.c_float)]


class PsInit(C.Structure):
    _fields_ = [("kind", C.c_uint32), ("scale", C.c_float), ("seed", C.c_uint64)]


class PsOptimizer(C.Structure):
    _fields_ = [("kind", C.c_uint32), ("lr", C.c_float), ("initial_accumulator", C.c_float),
                ("beta1", C.c_float), ("beta2", C.c_float), ("epsilon", C.c_float)]


class PsTableConfig(C.Structure):
    """``sw_ps_table_config``: a PS table's settings."""

    _fields_ = [
        ("table_id", C.c_uint32), ("dim", C.c_size_t), ("stored", C.c_uint8),
        ("served", C.c_uint8), ("init", PsInit), ("optimizer", PsOptimizer),
        ("create", C.c_uint32), ("admit_after", C.c_uint32),
        ("admission_counters", C.c_size_t), ("evict_untouched", C.c_uint32),
        ("max_rows", C.c_uint64), ("capacity", C.c_uint64), ("consistency", C.c_uint32),
        ("row_locks", C.c_size_t), ("huge_pages", C.c_bool),
        ("hot_sample_every", C.c_uint32), ("checkpoint_direct_io", C.c_bool),
    ]


class SaveReport(C.Structure):
    _fields_ = [("rows", C.c_uint64), ("bytes", C.c_uint64), ("seconds", C.c_double),
                ("writing_seconds", C.c_double), ("syncing_seconds", C.c_double),
                ("direct_io", C.c_bool)]


TABLE_METRICS = (
    "rows", "data_bytes", "memory_bytes", "committed_bytes", "index_capacity", "pulls",
    "pushes", "pulled_rows", "missing", "pushed_rows", "dropped_pushes", "created", "loaded",
    "not_admitted", "refused", "evicted_untouched", "evicted_over_cap", "index_builds",
    "clock")


class TableMetrics(C.Structure):
    _fields_ = [(name, C.c_uint64) for name in TABLE_METRICS] + [
        ("hot_sample_every", C.c_uint32)]


class HotId(C.Structure):
    _fields_ = [("id", C.c_uint64), ("sampled", C.c_uint64)]


MAINTAIN_REPORT = ("index_steps", "slots_reused", "slots_waiting", "evicted_untouched",
                   "evicted_over_cap")


class MaintainReport(C.Structure):
    _fields_ = [(name, C.c_uint64) for name in MAINTAIN_REPORT]


class LoadReport(C.Structure):
    _fields_ = [("created", C.c_uint64), ("overwritten", C.c_uint64)]


class Partition(C.Structure):
    _fields_ = [("kind", C.c_uint32), ("vocab", C.c_uint64)]


class Rows(C.Structure):
    _fields_ = [
        # The pointers as addresses (c_void_p, the same layout): set from numpy arrays
        # addresses without building typed pointers.
        ("table", C.c_uint32), ("dtype", C.c_uint8), ("row_dims", p), ("rank", C.c_uint32),
        ("ids", p), ("n", C.c_size_t), ("data", p), ("byte_len", C.c_uint64),
    ]


class StepReport(C.Structure):
    _fields_ = [("unique", C.c_size_t), ("missing", C.c_size_t), ("failed", C.c_size_t),
                ("first_failed", C.c_size_t), ("fallbacks", C.c_size_t)]


class Stats(C.Structure):
    """Counters of all of a runtime's loops (``sw_stats``)."""

    _fields_ = [(name, C.c_uint64) for name in (
        "frames_in", "frames_out", "bytes_in", "bytes_out", "requests_completed",
        "requests_failed", "connections_accepted", "connections_opened", "connections_lost",
        "payload_direct", "payload_copied", "connections_closed", "send_blocks_allocated")]


def _sig(name: str, res: Any, *args: Any) -> Callable[..., Any]:
    f = getattr(lib, name)
    f.restype, f.argtypes = res, list(args)
    return f  # type: ignore[no-any-return]


R = C.c_uint32  # sw_result

last_error = _sig("sw_last_error", C.c_char_p)
last_error_status = _sig("sw_last_error_status", C.c_uint32)
last_error_remote = _sig("sw_last_error_remote", C.c_char_p)
last_error_task = _sig("sw_last_error_task", C.c_char_p)
last_error_os_error = _sig("sw_last_error_os_error", C.c_int32)
version = _sig("starwire_version", C.c_char_p)

tensor_new = _sig("sw_tensor_new", R, C.c_uint8, p, C.c_uint32, p, C.c_uint64, C.POINTER(p))
tensor_wrap = _sig("sw_tensor_wrap", R, C.c_uint8, p, C.c_uint32, p, C.c_uint64, p, p,
                   C.POINTER(p))
tensor_free = _sig("sw_tensor_free", None, p)
tensor_shared = _sig("sw_tensor_shared", C.c_bool, p)
tensor_dtype = _sig("sw_tensor_dtype", C.c_uint8, p)
tensor_rank = _sig("sw_tensor_rank", C.c_uint32, p)
tensor_dims = _sig("sw_tensor_dims", u64p, p)
tensor_data = _sig("sw_tensor_data", p, p)
tensor_data_mut = _sig("sw_tensor_data_mut", p, p)
tensor_byte_len = _sig("sw_tensor_byte_len", C.c_uint64, p)
tensor_is_dead = _sig("sw_tensor_is_dead", C.c_bool, p)

mem_table_new = _sig("sw_mem_table_new", R, C.c_size_t, Init, Optimizer, C.POINTER(p))
table_new = _sig("sw_table_new", R, C.c_uint8, p, C.c_uint32, C.POINTER(TableCallbacks),
                 C.POINTER(p))
table_free = _sig("sw_table_free", None, p)

ps_table_config_default = _sig("sw_ps_table_config_default", PsTableConfig, C.c_size_t)
ps_table_new = _sig("sw_ps_table_new", R, C.POINTER(PsTableConfig), C.POINTER(p))
ps_table_load = _sig("sw_ps_table_load", R, C.POINTER(PsTableConfig), C.c_char_p,
                     C.POINTER(p))
ps_table_free = _sig("sw_ps_table_free", None, p)
ps_table_as_table = _sig("sw_ps_table_as_table", p, p)
ps_table_len = _sig("sw_ps_table_len", C.c_uint64, p)
ps_table_state_len = _sig("sw_ps_table_state_len", C.c_size_t, p)
ps_table_clock = _sig("sw_ps_table_clock", C.c_uint64, p)
ps_table_advance_clock = _sig("sw_ps_table_advance_clock", C.c_uint64, p)
checkpoint_file = _sig("sw_checkpoint_file", R, C.c_uint32, C.c_char_p, C.c_size_t)
ps_table_save = _sig("sw_ps_table_save", R, p, C.c_char_p, C.POINTER(SaveReport))
ps_table_report = _sig("sw_ps_table_report", R, p, C.POINTER(p))
ps_table_metrics = _sig("sw_ps_table_metrics", R, p, C.POINTER(TableMetrics),
                        C.POINTER(HotId), C.c_size_t, sizep)
ps_table_maintain = _sig("sw_ps_table_maintain", R, p, C.POINTER(MaintainReport))
# Arrays as addresses (c_void_p): numpy arrays' data.
ps_table_load_rows = _sig("sw_ps_table_load_rows", R, p, p, C.c_size_t, p, C.c_size_t, p,
                          C.c_size_t, C.POINTER(LoadReport))
ps_table_export_rows = _sig("sw_ps_table_export_rows", R, p, p, C.c_size_t, p, C.c_size_t,
                            p, C.c_size_t, p, sizep)
string_free = _sig("sw_string_free", None, p)

runtime_new = _sig("sw_runtime_new", R, C.POINTER(Options), C.POINTER(p))
runtime_port = _sig("sw_runtime_port", C.c_uint16, p)
runtime_publish = _sig("sw_runtime_publish", R, p, C.c_char_p, C.c_size_t, p)
runtime_abort_step = _sig("sw_runtime_abort_step", R, p, C.c_uint64)
runtime_stats = _sig("sw_runtime_stats", R, p, C.POINTER(Stats))
client_loop_stats = _sig("sw_client_loop_stats", R, p, C.POINTER(Stats))
runtime_free = _sig("sw_runtime_free", None, p)

resolver_new = _sig("sw_resolver_new", R, C.c_char_p, C.c_char_p, C.POINTER(p))
resolver_resolve = _sig("sw_resolver_resolve", R, p, C.c_char_p, C.c_char_p, C.c_size_t)
resolver_peer = _sig("sw_resolver_peer", R, p, C.c_char_p, C.c_char_p, C.c_size_t)
resolver_tasks = _sig("sw_resolver_tasks", R, p, C.c_char_p, sizep)
resolver_free = _sig("sw_resolver_free", None, p)

reply_count = _sig("sw_reply_count", C.c_size_t, p)
reply_status = _sig("sw_reply_status", C.c_uint32, p, C.c_size_t)
reply_take_tensor = _sig("sw_reply_take_tensor", p, p, C.c_size_t)
reply_rtt_us = _sig("sw_reply_rtt_us", C.c_double, p)
reply_missing = _sig("sw_reply_missing", R, p, C.c_size_t, u32p, C.c_size_t, sizep)
reply_refusal = _sig("sw_reply_refusal", C.c_char_p, p)
reply_free = _sig("sw_reply_free", None, p)

client_new = _sig("sw_client_new", R, p, C.c_uint32, C.POINTER(p))
client_new_embedded = _sig("sw_client_new_embedded", R, p, C.POINTER(C.c_char_p),
                           C.POINTER(C.c_char_p), C.c_size_t, C.POINTER(p))
client_free = _sig("sw_client_free", None, p)
client_ping = _sig("sw_client_ping", R, p, C.c_char_p, C.c_uint32, C.c_uint64, u64p)
client_pull = _sig("sw_client_pull", R, p, C.c_char_p, p, C.c_size_t, C.c_uint64, u64p)
client_push = _sig("sw_client_push", R, p, C.c_char_p, p, C.POINTER(p), C.c_size_t,
                   C.c_uint64, u64p)
client_recv = _sig("sw_client_recv", R, p, C.c_char_p, C.c_uint64, C.c_char_p, C.c_size_t,
                   C.c_uint64, u64p)
client_recv_many = _sig("sw_client_recv_many", R, p, C.c_char_p, C.c_uint64,
                        C.POINTER(C.c_char_p), sizep, C.c_size_t, C.c_uint64, u64p)
client_pull_rows = _sig("sw_client_pull_rows", R, p, C.c_char_p, C.POINTER(Rows), C.c_size_t,
                        C.c_uint64, u64p)
client_pull_rows_wait = _sig("sw_client_pull_rows_wait", R, p, C.c_char_p, C.POINTER(Rows),
                             C.c_uint64, u32p, sizep)
# Arrays as addresses (c_void_p): `held` (uint64), `versions` (uint64), `unchanged` (bool).
client_pull_rows_versioned_wait = _sig("sw_client_pull_rows_versioned_wait", R, p, C.c_char_p,
                                       C.POINTER(Rows), p, C.c_uint64, p, p, sizep, u32p,
                                       sizep)
# The same function without argument conversion, for `Client.pull_rows`' planned calls,
# which pass only ctypes values of the exact types (c_void_p, c_char_p, a reference to a
# Rows, c_uint64, a c_uint32 array, a reference to a c_size_t): converting arguments
# through `argtypes` costs more than the rest of such a call.
client_pull_rows_wait_unchecked = lib["sw_client_pull_rows_wait"]
client_pull_rows_wait_unchecked.restype = R
# A benchmarking aid (ffi/src/bench.rs): a blocking rows pull made by the Rust client
# itself (BENCH_PULL_RUST) or by sw_client_pull_rows_wait (BENCH_PULL_C), timed per call
# inside the library, for ffi/python/bench/bench_pull_rows.py to alternate with
# `Client.pull_rows`.
BENCH_PULL_RUST, BENCH_PULL_C = 0, 1
bench_pull_rows = _sig("sw_bench_pull_rows", R, p, C.c_char_p, C.POINTER(Rows), C.c_uint64,
                       C.c_uint32, C.c_size_t, u64p)
client_push_rows = _sig("sw_client_push_rows", R, p, C.c_char_p, C.POINTER(Rows), C.c_size_t,
                        C.c_uint64, u64p)
client_push_rows_tensors = _sig("sw_client_push_rows_tensors", R, p, C.c_char_p,
                                C.POINTER(Rows), C.POINTER(p), C.c_size_t, C.c_uint64, u64p)
client_wait = _sig("sw_client_wait", R, p, C.c_uint64, C.POINTER(p))
client_checkpoint = _sig("sw_client_checkpoint", R, p, C.c_char_p, C.c_uint64, u64p)
client_checkpoint_wait = _sig("sw_client_checkpoint_wait", R, p, C.c_char_p, C.c_uint64,
                              C.POINTER(p))
client_poll = _sig("sw_client_poll", R, p, u64p, C.POINTER(C.c_bool))
client_wait_any = _sig("sw_client_wait_any", R, p, u64p)

sharded_new = _sig("sw_sharded_new", R, C.POINTER(C.c_char_p), C.c_size_t, Partition,
                   C.c_uint32, C.c_uint8, p, C.c_uint32, C.POINTER(p))
sharded_pull = _sig("sw_sharded_pull", R, p, p, p, C.c_size_t, p, C.c_uint64, C.c_uint64,
                    C.POINTER(StepReport))
sharded_pull_unique = _sig("sw_sharded_pull_unique", R, p, p, p, C.c_size_t, p, p, p,
                           C.c_uint64, C.c_uint64, C.POINTER(StepReport))
sharded_push = _sig("sw_sharded_push", R, p, p, p, C.c_size_t, p, C.c_uint64, C.c_uint64,
                    C.POINTER(StepReport))
sharded_part = _sig("sw_sharded_part", R, p, C.c_size_t)
sharded_free = _sig("sw_sharded_free", None, p)
sharded_set_wire_dtype = _sig("sw_sharded_set_wire_dtype", R, p, C.c_uint8)
sharded_wire_dtype = _sig("sw_sharded_wire_dtype", C.c_uint8, p)
sharded_set_loss_scale = _sig("sw_sharded_set_loss_scale", R, p, C.c_float)


class TableShape(C.Structure):
    """``sw_table_shape``."""

    _fields_ = [("table", C.c_uint32), ("dtype", C.c_uint8), ("row_dims", p),
                ("rank", C.c_uint32), ("partition", Partition)]


class TableBatch(C.Structure):
    """``sw_table_batch``: arrays as addresses."""

    _fields_ = [("ids", p), ("n", C.c_size_t), ("data", p), ("byte_len", C.c_uint64)]


class UniqueBatch(C.Structure):
    """``sw_unique_batch``: arrays as addresses; `unique_len` written by the call."""

    _fields_ = [("ids", p), ("n", C.c_size_t), ("inverse", p), ("unique", p), ("data", p),
                ("byte_len", C.c_uint64), ("unique_len", C.c_size_t)]


sharded_tables_new = _sig("sw_sharded_tables_new", R, C.POINTER(C.c_char_p), C.c_size_t,
                          C.POINTER(TableShape), C.c_size_t, C.POINTER(p))
sharded_tables_free = _sig("sw_sharded_tables_free", None, p)
sharded_tables_set_wire_dtype = _sig("sw_sharded_tables_set_wire_dtype", R, p, C.c_uint8)
sharded_tables_set_loss_scale = _sig("sw_sharded_tables_set_loss_scale", R, p, C.c_float)
sharded_tables_pull = _sig("sw_sharded_tables_pull", R, p, p, C.POINTER(TableBatch),
                           C.c_size_t, C.c_uint64, C.POINTER(StepReport))
sharded_tables_push = _sig("sw_sharded_tables_push", R, p, p, C.POINTER(TableBatch),
                           C.c_size_t, C.c_uint64, C.POINTER(StepReport))
sharded_tables_pull_unique = _sig("sw_sharded_tables_pull_unique", R, p, p,
                                  C.POINTER(UniqueBatch), C.c_size_t, C.c_uint64,
                                  C.POINTER(StepReport))
sharded_tables_part = _sig("sw_sharded_tables_part", R, p, C.c_size_t)


class PipelineSettings(C.Structure):
    """``sw_pipeline_settings``."""

    _fields_ = [("staleness", C.c_uint32), ("max_pushes_in_flight", C.c_uint32),
                ("timeout_ms", C.c_uint64), ("wire_dtype", C.c_uint8),
                ("loss_scale", C.c_float), ("cache_bytes", C.c_uint64)]


PIPELINE_REPORT_COUNTS = ("unique", "missing", "rows_received", "rows_sent", "bytes_received",
                          "bytes_sent", "pushes_in_flight", "prefetched", "refetched",
                          "may_miss", "fallbacks", "cache_hits", "cache_misses", "cache_bytes",
                          "cache_evictions", "rows_unchanged")


class PipelineReport(C.Structure):
    """``sw_pipeline_report``."""

    _fields_ = [
        ("step", C.c_uint64), ("visible_seconds", C.c_double), ("waited_seconds", C.c_double),
        ("unique", C.c_size_t), ("missing", C.c_size_t), ("rows_received", C.c_size_t),
        ("rows_sent", C.c_size_t), ("bytes_received", C.c_uint64), ("bytes_sent", C.c_uint64),
        ("pushes_in_flight", C.c_size_t), ("prefetched", C.c_size_t),
        ("refetched", C.c_size_t), ("may_miss", C.c_uint64), ("fallbacks", C.c_size_t),
        ("cache_hits", C.c_size_t), ("cache_misses", C.c_size_t), ("cache_bytes", C.c_uint64),
        ("cache_evictions", C.c_uint64), ("rows_unchanged", C.c_size_t),
    ]


class PushFailure(C.Structure):
    """``sw_push_failure``."""

    _fields_ = [("step", C.c_uint64), ("shard", C.c_size_t), ("result", C.c_uint32),
                ("status", C.c_uint32)]


pipeline_settings_default = _sig("sw_pipeline_settings_default", PipelineSettings)
pipeline_new = _sig("sw_pipeline_new", R, p, C.POINTER(C.c_char_p), C.c_size_t, Partition,
                    C.c_uint32, C.c_uint8, p, C.c_uint32, PipelineSettings, C.POINTER(p))
# Arrays as addresses (c_void_p): numpy arrays' data.
pipeline_prefetch = _sig("sw_pipeline_prefetch", R, p, p, p, C.c_size_t,
                         C.POINTER(PipelineReport))
pipeline_pull = _sig("sw_pipeline_pull", R, p, p, p, C.c_size_t, p, C.c_uint64,
                     C.POINTER(PipelineReport))
pipeline_push = _sig("sw_pipeline_push", R, p, p, p, C.c_size_t, p, C.c_uint64,
                     C.POINTER(PipelineReport))
pipeline_flush = _sig("sw_pipeline_flush", R, p, p, C.POINTER(PipelineReport))
pipeline_current_report = _sig("sw_pipeline_current_report", R, p, C.POINTER(PipelineReport))
pipeline_steps = _sig("sw_pipeline_steps", C.c_uint64, p)
pipeline_pushes = _sig("sw_pipeline_pushes", C.c_uint64, p)
pipeline_pushes_in_flight = _sig("sw_pipeline_pushes_in_flight", C.c_size_t, p)
pipeline_failed_pushes = _sig("sw_pipeline_failed_pushes", C.c_size_t, p)
pipeline_failed_push = _sig("sw_pipeline_failed_push", R, p, C.c_size_t,
                            C.POINTER(PushFailure))
pipeline_failed_push_error = _sig("sw_pipeline_failed_push_error", R, p, C.c_size_t)
pipeline_free = _sig("sw_pipeline_free", None, p)
pipeline_new_tables = _sig("sw_pipeline_new_tables", R, p, C.POINTER(C.c_char_p), C.c_size_t,
                           C.POINTER(TableShape), C.c_size_t, PipelineSettings, C.POINTER(p))
pipeline_tables = _sig("sw_pipeline_tables", C.c_size_t, p)
pipeline_prefetch_tables = _sig("sw_pipeline_prefetch_tables", R, p, p, C.POINTER(TableBatch),
                                C.c_size_t, C.POINTER(PipelineReport))
pipeline_pull_tables = _sig("sw_pipeline_pull_tables", R, p, p, C.POINTER(TableBatch),
                            C.c_size_t, C.POINTER(PipelineReport))
pipeline_push_tables = _sig("sw_pipeline_push_tables", R, p, p, C.POINTER(TableBatch),
                            C.c_size_t, C.POINTER(PipelineReport))
pipeline_pull_unique = _sig("sw_pipeline_pull_unique", R, p, p, p, C.c_size_t, p, p, p,
                            C.c_uint64, C.POINTER(C.c_size_t), C.POINTER(PipelineReport))
pipeline_pull_tables_unique = _sig("sw_pipeline_pull_tables_unique", R, p, p,
                                   C.POINTER(UniqueBatch), C.c_size_t,
                                   C.POINTER(PipelineReport))
