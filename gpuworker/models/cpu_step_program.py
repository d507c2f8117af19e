"""A list of C kernel calls run by one foreign call (inferq_kernels/cpu/step_program.c).

The CPU decode replay (cpu_decode_replay.py) records a step as ~10 kernel calls a layer on
fixed buffers. Made from Python each such call costs a few microseconds of ctypes argument
conversion and a release and retake of the GIL, ~2 ms a step on a 30-layer model: a quarter of
a quantized model's batch-1 step. Here the calls are encoded once into an array of ops (the
kernel's address, its call shape, its arguments) that ``run_step_program`` walks in C.

A step is one list of ``(fn, args)`` in call order; an argument may be a ``PerStep`` (read
from ``params`` at each run); ``kv_store`` and ``gather`` are the ops with no kernel. ``StepProgram.build``
encodes the list for C. An op's call shape is read from the ctypes function's own ``argtypes``
and ``restype`` (the prototypes step_program.c knows), so a kernel whose signature is not one
of them, or a Python callable (a timed wrapper, a projection through torch), makes ``build``
return None; ``PythonSteps`` then makes the same calls from Python.

At several threads a program whose kernels all share their work in a team (listed in their
files' ``team_kernels[]``: ``loader.shares_in_team``) runs as one parallel region, each kernel
taking the calling thread's share and the threads meeting at a barrier after each op
(step_program.c's ``run_team``); any other program runs op by op, each kernel in its own region.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Optional

from inferq.kernels.cpu import loader

MAX_ARGS = 18

_p, _i, _c, _f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
# (argtypes, restype) -> the SHAPE_* number of step_program.c
_SHAPES = {
    ((_p, _p, _p, _p, _i, _i, _f), _c): 0,
    ((_p, _i, _i, _p, _i, _i, _i, _p, _p, _p, _p, _i), _c): 1,
    ((_p, _i, _p, _i, _p, _p, _p, _i, _p, _p, _p, _i, _i, _i, _i, _i, _f, _p), _c): 2,
    ((_p, _i, _i, _p, _i, _i, _p, _p, _i), _c): 3,
    ((_p, _i, _i, _p, _i, _i, _p, _i), _c): 4,
    ((_p, _i, _i, _p, _i), _c): 5,
    ((_p, _i, _c, _i, _i, _p, _p, _p), None): 6,
    ((_c, _p, _p, _p, _i, _i, _p, _i, _p, _i, _c), _c): 7,
    ((_c, _p, _i, _i, _p, _i, _p, _c), _c): 8,
    ((_p, _i, _i, _i, _p), _c): 9,
}
_KV_STORE, _GATHER = 10, 11  # the ops with no kernel


class StepOp(ctypes.Structure):
    """step_program.c's ``step_op``."""

    _fields_ = [("fn", ctypes.c_void_p), ("shape", ctypes.c_int32), ("per_step", ctypes.c_uint32),
                ("a", ctypes.c_int64 * MAX_ARGS), ("f", ctypes.c_float * 2)]


class PerStep:
    """An argument set before each run: ``params[index]``."""

    def __init__(self, index: int) -> None:
        self.index = index


def kv_store(key_cache: int, value_cache: int, k_rows: int, k_stride: int, v_rows: int, v_stride: int,
             row_bytes: int, rows: int, slots: int) -> int:
    """Row r of k (``k_rows + r * k_stride``) and of v to cache slot ``slots[r]`` (the address of an
    int64 array): the Python twin of step_program.c's SHAPE_KV_STORE."""
    for r, slot in enumerate((ctypes.c_int64 * rows).from_address(slots)):
        ctypes.memmove(key_cache + slot * row_bytes, k_rows + r * k_stride, row_bytes)
        ctypes.memmove(value_cache + slot * row_bytes, v_rows + r * v_stride, row_bytes)
    return 0


def gather(dst: int, src: int, row_bytes: int, idx: int, rows: int, src_rows: int) -> int:
    """Row ``idx[r]`` of ``src`` to row r of ``dst`` (``idx`` the address of int64s), or -1 with
    nothing copied for an index outside ``[0, src_rows)``: step_program.c's SHAPE_GATHER."""
    picked = list((ctypes.c_int64 * rows).from_address(idx))
    if any(i < 0 or i >= src_rows for i in picked):
        return -1
    for r, i in enumerate(picked):
        ctypes.memmove(dst + r * row_bytes, src + i * row_bytes, row_bytes)
    return 0


_NO_KERNEL = ((kv_store, _KV_STORE), (gather, _GATHER))

_lock = threading.Lock()
_loaded: "ctypes.CDLL | None | bool" = False


def load() -> Optional[ctypes.CDLL]:
    """The built step_program.c, or None (no compiler, ``INFERQ_CPU_KERNELS=0``, a layout mismatch)."""
    global _loaded
    with _lock:
        if _loaded is False:
            lib = loader.build("step_program", ["-O2"]) if loader.enabled() else None
            if lib is not None:
                lib.run_step_program.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                                 ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
                lib.run_step_program.restype = ctypes.c_int
                if lib.step_op_bytes() != ctypes.sizeof(StepOp):
                    lib = None
            _loaded = lib
        return _loaded  # type: ignore[return-value]


def _arg(v) -> int:
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"step program arguments are integers or addresses, got {type(v).__name__}")
    return v


class StepProgram:
    """Ops added in order, then ``seal()``, then ``run()`` per step after setting ``params``."""

    @classmethod
    def build(cls, lib: Optional[ctypes.CDLL], ops, n_params: int) -> "Optional[StepProgram]":
        """``ops`` as one sealed program, or None where there is no library or an op has no shape."""
        if lib is None:
            return None
        prog = cls(lib, n_params)
        if not all(prog.add(fn, args) for fn, args in ops):
            return None
        prog.seal()
        return prog

    def __init__(self, lib: ctypes.CDLL, n_params: int) -> None:
        self.lib = lib
        self.params = (ctypes.c_int64 * max(1, n_params))()
        self._ops: list[StepOp] = []
        self._array = None
        self._failed = ctypes.c_int64(-1)
        # every kernel shares its work in a team (loader.shares_in_team): then at several threads
        # the program runs as one parallel region (step_program.c's run_team)
        self.team = True

    def __len__(self) -> int:
        return len(self._ops)

    def add(self, fn, args) -> bool:
        """Append ``fn(*args)``; False (nothing added) where ``fn`` has no known call shape."""
        no_kernel = next((shape for f, shape in _NO_KERNEL if f is fn), None)
        if no_kernel is not None:
            op = StepOp(fn=None, shape=no_kernel)
            for j, v in enumerate(args):
                if isinstance(v, PerStep):
                    op.per_step |= 1 << j
                    v = v.index
                op.a[j] = _arg(v)
            self._ops.append(op)
            return True  # run by the team's thread 0
        shape = _SHAPES.get((tuple(getattr(fn, "argtypes", None) or ()), getattr(fn, "restype", None)))
        if shape is None or not isinstance(fn, ctypes._CFuncPtr):
            return False
        argtypes = fn.argtypes
        if len(args) != len(argtypes):
            raise TypeError(f"{fn.__name__} takes {len(argtypes)} arguments, got {len(args)}")
        op = StepOp(fn=ctypes.cast(fn, ctypes.c_void_p).value, shape=shape)
        self.team = self.team and loader.shares_in_team(op.fn)
        n_int = n_float = 0
        for t, v in zip(argtypes, args):
            if t is _f:
                op.f[n_float] = v
                n_float += 1
                continue
            if isinstance(v, PerStep):
                op.per_step |= 1 << n_int
                v = v.index
            op.a[n_int] = _arg(v)
            n_int += 1
        self._ops.append(op)
        return True

    def seal(self) -> None:
        self._array = (StepOp * len(self._ops))(*self._ops)

    def run(self, team: bool = True) -> tuple[int, int]:
        """(0, -1), or (the first non-zero return, the index of its op). ``team=False`` runs it op
        by op even where it could run as a team (``inferq bench step-breakdown --op-by-op``)."""
        rc = self.lib.run_step_program(self._array, len(self._ops), self.params, ctypes.byref(self._failed),
                                       self.team and team)
        return rc, self._failed.value if rc else -1


class PythonSteps:
    """The same ops made one by one from Python, with StepProgram's ``params`` and ``run()``."""

    def __init__(self, ops, n_params: int) -> None:
        self.params = [0] * max(1, n_params)
        # (fn, args, whether an argument is read per run)
        self._ops = [(fn, tuple(args), any(isinstance(a, PerStep) for a in args)) for fn, args in ops]

    def __len__(self) -> int:
        return len(self._ops)

    def run(self, team: bool = True) -> tuple[int, int]:
        params = self.params
        for i, (fn, args, per_step) in enumerate(self._ops):
            if per_step:
                args = tuple(params[a.index] if isinstance(a, PerStep) else a for a in args)
            rc = fn(*args)
            if rc:  # 0, or None from a kernel that returns nothing
                return rc, i
        return 0, -1
