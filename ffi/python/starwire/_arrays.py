"""numpy arrays in and out of starwire, without copies.

Out: a received tensor's memory (where its payload was received) becomes a numpy array
that owns the tensor; freeing the array frees the tensor. In: an array to send becomes a
tensor over the array's own memory (``sw_tensor_wrap``); the array is kept alive until
starwire holds no reference to that tensor (`Lender`).
"""

from __future__ import annotations

import ctypes as C
import math
import threading
from typing import Any, Optional

import numpy as np
import numpy.typing as npt

from . import _lib
from .errors import InvalidArgument, check


_from_buffer = C.c_char.from_buffer
_addressof = C.addressof


def address(array: npt.NDArray[Any]) -> int:
    """The address of a C-contiguous array's data. Through the buffer protocol (a third of
    ``array.ctypes.data``'s cost); read-only and empty arrays take the slow way."""
    try:
        return _addressof(_from_buffer(array))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return int(array.ctypes.data)


def code_of(dtype: np.dtype[Any], what: str) -> int:
    """The wire dtype code of `dtype`, or `InvalidArgument`."""
    code = _lib.CODES.get(dtype)
    if code is None:
        supported = ", ".join(sorted(str(d) for d in _lib.CODES))
        raise InvalidArgument(f"{what} has dtype {dtype}, which starwire does not carry "
                              f"(it carries {supported})")
    return code


#: The wire dtypes float rows may travel as, by the names `wire_code` takes.
WIRE_NAMES: dict[str, int] = {
    "float32": 10, "f32": 10, "bfloat16": 7, "bf16": 7, "float16": 6, "f16": 6, "half": 6,
}
#: The name of each wire dtype code float rows may travel as.
WIRE_NAME_OF: dict[int, str] = {10: "float32", 7: "bfloat16", 6: "float16"}


def wire_code(wire_dtype: Any, rows: np.dtype[Any]) -> int:
    """The wire dtype code rows of `rows` travel as, for `wire_dtype`: None for the rows'
    own; ``"float32"``/``"f32"``, ``"bfloat16"``/``"bf16"``, ``"float16"``/``"f16"`` (or
    ``np.float32``, ``np.float16``) for float32, bfloat16 and float16 rows. Anything else is
    `InvalidArgument`, naming what is accepted (the library checks that the rows convert)."""
    if wire_dtype is None:
        return code_of(rows, "the rows")
    if isinstance(wire_dtype, str):
        code = WIRE_NAMES.get(wire_dtype.lower())
    else:
        try:
            dt = np.dtype(wire_dtype)
        except TypeError:
            code = None
        else:
            code = {np.dtype(np.float32): 10, np.dtype(np.float16): 6}.get(dt)
    if code is None:
        raise InvalidArgument(f"wire_dtype {wire_dtype!r} is not one rows travel as: "
                              "'float32' ('f32'), 'bfloat16' ('bf16') or 'float16' ('f16'), "
                              "or None for the rows' own dtype")
    return code


def loss_scale_value(loss_scale: Any) -> float:
    """`loss_scale` as the C ABI takes it: 0.0 for None, else a finite positive float
    (`InvalidArgument` otherwise; the library checks the range, 2^-126 to 2^126)."""
    if loss_scale is None:
        return 0.0
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float, np.floating,
                                                                    np.integer)):
        raise InvalidArgument(f"loss_scale {loss_scale!r} is not a number (the factor the "
                              "gradients were multiplied by), or None")
    value = float(loss_scale)
    if not math.isfinite(value) or value <= 0.0:
        raise InvalidArgument(f"loss_scale {loss_scale!r} is not a finite positive number "
                              "(2^-126 to 2^126), or None")
    return value


def contiguous(array: Any, what: str) -> npt.NDArray[Any]:
    """`array` itself when it is a C-contiguous numpy array, else `InvalidArgument` (no
    silent copy: the caller decides)."""
    if not isinstance(array, np.ndarray):
        raise InvalidArgument(f"{what} must be a numpy array, not {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise InvalidArgument(f"{what} is not C-contiguous (strides {array.strides}); pass "
                              f"np.ascontiguousarray({what}) to send a copy")
    return array


def view(address: int, nbytes: int, dtype: np.dtype[Any], shape: tuple[int, ...],
         owner: Any = None) -> npt.NDArray[Any]:
    """A numpy array over `nbytes` at `address` (no copy), keeping `owner` alive."""
    if nbytes == 0:
        return np.empty(shape, dtype=dtype)
    buf = (C.c_char * nbytes).from_address(address)
    if owner is not None:
        buf._starwire_owner = owner  # type: ignore[attr-defined]
    return np.frombuffer(memoryview(buf), dtype=dtype).reshape(shape)


class _Tensor:
    """Owns one tensor handle: the base object of the array over its memory."""

    __slots__ = ("handle",)

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __del__(self) -> None:
        _lib.tensor_free(self.handle)


class HookArrays:
    """Arrays an allocator hook handed starwire for received tensors, by address, until
    starwire releases them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: dict[int, npt.NDArray[Any]] = {}

    def add(self, array: npt.NDArray[Any]) -> int:
        address = int(array.ctypes.data)
        with self.lock:
            self.live[address] = array
        return address

    def release(self, address: int) -> None:
        with self.lock:
            self.live.pop(address, None)

    def get(self, address: int) -> Optional[npt.NDArray[Any]]:
        with self.lock:
            return self.live.get(address)


def received(handle: int, hooks: Optional[HookArrays]) -> npt.NDArray[Any]:
    """The numpy array of a received tensor `handle` (taken from a reply; this takes
    ownership): the allocator hook's array when the hook allocated it, else an array over
    the memory starwire received the payload into (writable: the handle is its only
    reference)."""
    dtype = _lib.DTYPES.get(_lib.tensor_dtype(handle), np.dtype(np.uint8))
    rank = _lib.tensor_rank(handle)
    dims = _lib.tensor_dims(handle)
    shape = tuple(dims[i] for i in range(rank))
    nbytes = _lib.tensor_byte_len(handle)
    address = _lib.tensor_data_mut(handle)
    if hooks is not None and address:
        array = hooks.get(address)
        if array is not None:
            # The hook's own array; freeing the handle gives it back (release), and the
            # caller's reference keeps the memory.
            _lib.tensor_free(handle)
            return array
    owner = _Tensor(handle)
    if not address:
        # Shared with another reference: read-only.
        address = _lib.tensor_data(handle) or 0
        arr = view(address, nbytes, dtype, shape, owner)
        arr.flags.writeable = False
        return arr
    return view(address, nbytes, dtype, shape, owner)


class Lender:
    """Arrays lent to starwire as tensors over their memory (no copy), each kept alive
    until starwire holds no reference to its tensor."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lent: list[tuple[int, npt.NDArray[Any]]] = []

    def wrap(self, array: Any, what: str) -> int:
        """A tensor handle over `array`'s memory (the caller frees it with `give_back`)."""
        a = contiguous(array, what)
        code = code_of(a.dtype, what)
        dims = (C.c_uint64 * max(a.ndim, 1))(*a.shape)
        out = C.c_void_p()
        check(_lib.tensor_wrap(code, C.addressof(dims), a.ndim, a.ctypes.data, a.nbytes, None,
                               None, C.byref(out)))
        return int(out.value or 0)

    def give_back(self, handles: list[tuple[int, npt.NDArray[Any]]]) -> None:
        """Frees the caller's handles of tensors over these arrays; each array is kept
        until starwire's own references are gone too."""
        with self.lock:
            self.lent.extend(handles)
        self.sweep()

    def sweep(self) -> None:
        """Lets go of the arrays starwire no longer holds."""
        with self.lock:
            if not self.lent:
                return
            keep = []
            for handle, array in self.lent:
                if _lib.tensor_shared(handle):
                    keep.append((handle, array))
                else:
                    _lib.tensor_free(handle)
            self.lent = keep

    def held(self) -> int:
        """Arrays starwire still holds (a push not yet written, a publish not received)."""
        self.sweep()
        with self.lock:
            return len(self.lent)

    def close(self) -> None:
        """Frees every handle: only once the runtime is stopped (it holds none then)."""
        with self.lock:
            for handle, _ in self.lent:
                _lib.tensor_free(handle)
            self.lent = []
