"""Input checks shared by the fairness functions.

Every check raises ``ValueError`` whose message names the argument, the consumer (or VM, host)
and the resource at fault, because operators feed these functions from CSV files and agents and
need to find the bad number, not a numpy traceback.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Labels:
    """Turns row/column indices into the names an operator knows ("consumer 'c2'")."""

    def __init__(self, kind: str, names: Sequence[str] | None, count: int) -> None:
        if names is not None and len(names) != count:
            raise ValueError(f"{len(names)} {kind} names given for {count} {kind}s")
        self.kind = kind
        self.names = None if names is None else [str(n) for n in names]

    def __call__(self, index: int) -> str:
        if self.names is None:
            return f"{self.kind} #{index}"
        return f"{self.kind} {self.names[index]!r}"


def as_float_array(name: str, value: object, ndim: int) -> np.ndarray:
    """``value`` as a float64 array of ``ndim`` dimensions, or a ValueError saying why not."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric: {exc}") from None
    if arr.ndim != ndim:
        shape = "a vector" if ndim == 1 else f"a {ndim}-D array"
        raise ValueError(f"{name} must be {shape}, got shape {arr.shape}")
    return arr


def as_index_array(name: str, value: object, count: int, bound: int, target: str) -> np.ndarray:
    """An integer vector of length ``count`` with entries in ``[0, bound)``."""
    arr = np.asarray(value)
    if arr.ndim != 1 or arr.shape[0] != count:
        raise ValueError(f"{name} must be a vector of length {count}, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must hold integer {target} indices, got dtype {arr.dtype}")
    arr = arr.astype(np.intp, copy=False)
    # Two reductions settle the usual case; only a bad index pays for finding where it is.
    if arr.size == 0 or (arr.min() >= 0 and arr.max() < bound):
        return arr
    bad = np.flatnonzero((arr < 0) | (arr >= bound))
    if bad.size:
        j = int(bad[0])
        raise ValueError(
            f"{name}[{j}] = {arr[j]} names no {target}: there are {bound}, indexed 0..{bound - 1}"
        )
    return arr


def check_shape(name: str, arr: np.ndarray, shape: tuple[int, ...], meaning: str) -> None:
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape} ({meaning}), got {arr.shape}")


def check_amounts(
    name: str,
    arr: np.ndarray,
    rows: Labels | None,
    cols: Labels,
    *,
    positive: bool = False,
    allow_nan: bool = False,
) -> None:
    """Amounts must be finite and >= 0 (> 0 with ``positive``); NaN only with ``allow_nan``."""
    if arr.size == 0:
        return
    # Fast path: the smallest and largest amount say whether all are fine in two passes of
    # reading (a NaN makes min/max NaN, which fails both tests; fmin/fmax skip NaN), where the
    # element-wise masks below cost five passes and four temporaries of the array's size —
    # as much as the accounting itself on a 10^6-VM cloud. Only bad input takes the slow path.
    lo = np.fmin.reduce(arr, axis=None) if allow_nan else arr.min()
    hi = np.fmax.reduce(arr, axis=None) if allow_nan else arr.max()
    if (lo > 0 if positive else lo >= 0) and hi < np.inf:
        return
    finite = np.isfinite(arr)
    bad_value = ~finite if not allow_nan else np.isinf(arr)
    low = arr <= 0 if positive else arr < 0
    bad = bad_value | (finite & low)
    if not bad.any():
        return
    where = np.argwhere(bad)[0]
    value = float(arr[tuple(where)])
    place = cols(int(where[0])) if rows is None else f"{rows(int(where[0]))}, {cols(int(where[1]))}"
    if not np.isfinite(value):
        why = "is not a finite number"
    elif positive and value == 0:
        why = "is zero; it must be > 0"
    else:
        why = "is negative" if value < 0 else "must be > 0"
    raise ValueError(f"{name} for {place} = {value!r} {why}")


def check_gamma(gamma: float) -> float:
    try:
        g = float(gamma)
    except (TypeError, ValueError):
        raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}") from None
    if not (0.0 <= g <= 1.0):
        raise ValueError(f"gamma = {gamma!r} is outside [0, 1]")
    return g


def resource_weights(weights: object, m: int, cols: Labels) -> np.ndarray:
    """The weight vector w (default all ones), each finite and >= 0, not all zero."""
    if weights is None:
        return np.ones(m)
    w = as_float_array("weights", weights, 1)
    check_shape("weights", w, (m,), "one per resource")
    check_amounts("weights", w, None, cols)
    if not w.any():
        raise ValueError("weights are all zero: at least one resource must count")
    return w
