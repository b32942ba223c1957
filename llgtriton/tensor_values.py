"""The wire's tensors as numpy arrays: their dtypes, one value made a ``[1, 1]`` tensor, and one
request's values read back from a ``[1, n]`` or ``[n]`` tensor."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

from llgtriton.wire_errors import WireError

Array = npt.NDArray[np.generic]

NUMPY_DTYPES: dict[str, type[np.generic]] = {
    "STRING": np.object_,
    "INT32": np.int32,
    "UINT64": np.uint64,
    "FP32": np.float32,
    "BOOL": np.bool_,
}


def client_datatype(triton_type: str) -> str:
    """The datatype string tritonclient expects (``BYTES`` for config's ``STRING``)."""
    return "BYTES" if triton_type == "STRING" else triton_type


def scalar(name: str, triton_type: str, value: object) -> Array:
    """A ``[1, 1]`` tensor of ``value``; an integer outside the type's range is refused, not wrapped."""
    dtype = NUMPY_DTYPES[triton_type]
    if dtype is np.object_:
        assert isinstance(value, str)
        return np.array([[value.encode("utf-8")]], dtype=np.object_)
    if isinstance(value, int) and not isinstance(value, bool):
        limits = np.iinfo(dtype)  # type: ignore[type-var]
        if not limits.min <= value <= limits.max:
            raise WireError(f"{name!r} must be within [{limits.min}, {limits.max}], got {value}")
    return np.array([[value]], dtype=dtype)


TensorGetter = Callable[[str], "Array | None"]
# The values of one response's tensor, already flat (see decode_output_values).
ValuesGetter = Callable[[str], "Sequence[object] | None"]


def values_of(name: str, array: Array) -> list[object]:
    """The values of one request's tensor, accepting ``[1, n]`` (batched) and ``[n]`` shapes."""
    if array.ndim == 2:
        if array.shape[0] != 1:
            raise WireError(f"{name!r} has a batch of {array.shape[0]}; send one request per prompt")
        array = array[0]
    if array.ndim != 1:
        raise WireError(f"{name!r} must have shape [1, n] or [n], got {list(array.shape)}")
    return list(array.tolist())


def text_of(value: object, name: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireError(f"{name!r} is not valid UTF-8: {exc}") from None
    if isinstance(value, str):
        return value
    raise WireError(f"{name!r} must be BYTES, got {type(value).__name__}")


def flat(get: TensorGetter) -> ValuesGetter:
    def values(name: str) -> list[object] | None:
        array = get(name)
        return None if array is None else values_of(name, array)

    return values


def single(values: ValuesGetter, name: str) -> object | None:
    found = values(name)
    if found is None:
        return None
    if len(found) != 1:
        raise WireError(f"{name!r} must hold one value, got {len(found)}")
    return found[0]
