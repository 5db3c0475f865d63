"""Row ids and row shapes as the C ABI takes them, checked before anything is sent: ids
are u64 on the wire, a row shape is up to 7 dimensions of at least 1."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import numpy as np
import numpy.typing as npt

from .errors import InvalidArgument

_U64_LIMIT = 1 << 64
_IDS_ARE = ("ids are u64 on the wire: Python ints or an integer array, 0 to 2^64-1 (uint64 "
            "as it is, int64 with no negative value)")


def _bad_id(where: str, value: Any, why: str) -> InvalidArgument:
    return InvalidArgument(f"{where} is {value!r}: {why}; {_IDS_ARE}")


def _id(value: Any, where: str) -> int:
    """One id, checked: a Python int (or numpy integer) in 0..2^64-1; floats, bools and
    anything else raise `InvalidArgument`."""
    if isinstance(value, (bool, np.bool_)):
        raise _bad_id(where, value, "a bool, not an id")
    if not isinstance(value, (int, np.integer)):
        raise _bad_id(where, value, f"a {type(value).__name__}, not an integer")
    v = int(value)
    if v < 0:
        raise _bad_id(where, value, "negative")
    if v >= _U64_LIMIT:
        raise _bad_id(where, value, "2^64 or more")
    return v


def _checked_array(a: npt.NDArray[Any]) -> npt.NDArray[np.uint64]:
    """An integer array of ids as a C-contiguous uint64 array, checked with whole-array
    operations (no Python loop per id)."""
    kind = a.dtype.kind
    if kind == "u":
        return np.ascontiguousarray(a, dtype=np.uint64)
    if kind == "i":
        if a.size and a.min() < 0:
            i = int(np.flatnonzero(a.reshape(-1) < 0)[0])
            raise _bad_id(f"ids[{i}]", int(a.reshape(-1)[i]), "negative")
        return np.ascontiguousarray(a, dtype=np.uint64)
    if kind == "O":
        return _object_ids(a)
    raise InvalidArgument(f"ids have dtype {a.dtype}, not an integer dtype: {_IDS_ARE}; "
                          "convert explicitly (ids.astype(np.uint64)) if these are ids")


def _object_ids(raw: npt.NDArray[Any]) -> npt.NDArray[np.uint64]:
    """Ids numpy could not give one integer dtype (ints past int64 beside negative ones,
    or past 2^64, or not ints at all): checked one by one, only for such unusual input."""
    flat = raw.reshape(-1)
    for i, x in enumerate(flat):
        _id(x, f"ids[{i}]")
    return np.array([int(x) for x in flat], dtype=np.uint64).reshape(raw.shape)


def _row_ids(ids: Any) -> npt.NDArray[np.uint64]:
    """`ids` as a 1-D C-contiguous uint64 array, checked before anything is sent: itself
    when it already is one (no copy, nothing to check), else converted from an integer
    array (a negative id refused) or a sequence of Python ints (floats, bools, negatives
    and values of 2^64 or more refused), each raising `InvalidArgument`."""
    if isinstance(ids, np.ndarray):
        if ids.dtype == np.uint64 and ids.flags.c_contiguous:
            a = ids
        else:
            a = _checked_array(ids)
    else:
        if isinstance(ids, (list, tuple)):
            # Each type looked at once (the scan of types runs in C), a position found only
            # for a bad one: numpy would take True beside ints as 1 without a word.
            kinds = set(map(type, ids))
            for k in kinds:
                if issubclass(k, (bool, np.bool_)) or not issubclass(k, (int, np.integer)):
                    i, bad = next((i, x) for i, x in enumerate(ids) if type(x) is k)
                    _id(bad, f"ids[{i}]")
            # Into int64 when they fit (exact, then checked as an array); numpy would
            # otherwise make floats of ints past 2^63 beside others.
            raw: Optional[npt.NDArray[Any]] = None
            if all(k is int or issubclass(k, np.signedinteger) for k in kinds):
                try:
                    raw = np.array(ids, dtype=np.int64)
                except OverflowError:
                    pass
            if raw is None:
                raw = np.array(ids, dtype=object)
        else:
            # Another sequence (a range, an array-like): numpy's own conversion.
            raw = np.asarray(ids)
        a = _checked_array(raw)
    if a.ndim != 1:
        raise InvalidArgument(f"ids must be 1-D, not of shape {list(a.shape)}")
    return a


def _row_shape(row_shape: Union[int, Sequence[int]]) -> tuple[int, ...]:
    if type(row_shape) is int and 0 < row_shape:
        return (row_shape,)
    shape = (int(row_shape),) if isinstance(row_shape, (int, np.integer)) else tuple(
        int(d) for d in row_shape)
    if any(d <= 0 for d in shape) or len(shape) > 7:
        raise InvalidArgument(f"row shape {list(shape)}: up to 7 dimensions, each at least 1")
    return shape


def _held_versions(held: Any, n: int) -> npt.NDArray[np.uint64]:
    """The row versions a versioned pull holds, one per id (0: none held), as a 1-D
    C-contiguous uint64 array (`held` itself when it is one), checked: integers in
    0..2^64-1, exactly `n` of them; `InvalidArgument` naming `held` otherwise."""
    if isinstance(held, np.ndarray) and held.dtype == np.uint64 and held.flags.c_contiguous:
        a = held
    else:
        raw = np.asarray(held)
        if raw.size == 0:
            raw = raw.astype(np.uint64)
        if raw.dtype.kind == "i":
            if raw.size and raw.min() < 0:
                raise InvalidArgument(f"held has a negative version ({int(raw.min())}); "
                                      "versions are 0 (none held) to 2^64-1")
            a = np.ascontiguousarray(raw, dtype=np.uint64)
        elif raw.dtype.kind == "u":
            a = np.ascontiguousarray(raw, dtype=np.uint64)
        else:
            raise InvalidArgument(f"held has dtype {raw.dtype}, not integers: versions are "
                                  "0 (none held) to 2^64-1, one per id")
    if a.ndim != 1 or len(a) != n:
        raise InvalidArgument(f"held has shape {list(a.shape)}: one version per id, "
                              f"[{n}]")
    return a
