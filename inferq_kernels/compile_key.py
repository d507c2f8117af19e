"""The key Triton compiles a launch under, worked out on any machine (no GPU, no compile).

``JITFunction.run`` binds a launch's arguments with a binder generated from the
kernel's signature and its ``do_not_specialize`` / ``do_not_specialize_on_alignment``
options; each distinct result (argument types, ints equal to 1 baked in as
constants, ints and pointers divisible by 16, constexpr values, launch options)
is a separate compile. ``compile_key`` runs that same binder, from the installed
Triton, over a ``KernelLaunch``'s arguments, so tests can count the compiles a
range of steps would cause. Under ``TRITON_INTERPRET=1`` the kernel is rebuilt as
a ``JITFunction`` with the options it was declared with.
"""
from __future__ import annotations

import functools

from inferq.kernels.runtime import KernelLaunch

# The GPU the keys are worked out for; the specialisation rules are the same on every CUDA arch.
HOPPER = ("cuda", 90, 32)


@functools.lru_cache(maxsize=None)
def cuda_backend():
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    return make_backend(GPUTarget(*HOPPER))


_JIT_TWINS: dict = {}


def as_jit_function(kernel):
    """The ``JITFunction`` of a kernel, also when ``triton.jit`` built an interpreted one."""
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, JITFunction):
        return kernel
    if kernel.fn not in _JIT_TWINS:  # the interpreter keeps the jit options it was given
        _JIT_TWINS[kernel.fn] = JITFunction(kernel.fn, **kernel.kwargs)
    return _JIT_TWINS[kernel.fn]


_BINDERS: dict = {}


def _binder(jit_function):
    from triton.runtime.jit import create_function_from_signature

    if id(jit_function) not in _BINDERS:  # kernels are module globals: ids stay valid
        _BINDERS[id(jit_function)] = create_function_from_signature(
            jit_function.signature, jit_function.params, cuda_backend()
        )
    return _BINDERS[id(jit_function)]


def specialization(kernel, args: tuple, kwargs: dict) -> tuple[list, dict]:
    """Triton's per-argument specialisation of a launch, and the launch options left over.

    Each entry is ``(type, attribute)``: ``("*bf16", "D")`` a 16-byte aligned
    pointer, ``("i32", "D")`` an int divisible by 16, ``("constexpr", 1)`` an int
    equal to 1 (or a constexpr), ``(..., None)`` an argument not specialised.
    """
    jit_function = as_jit_function(kernel)
    _, spec, options = _binder(jit_function)(*args, **kwargs)
    return spec, options


def compile_key(launch: KernelLaunch) -> tuple:
    """Hashable: two launches with equal keys run the same compiled kernel."""
    spec, options = specialization(launch.kernel, launch.args, launch.kwargs)
    return (launch.kernel.fn.__name__, tuple(_hashable(s) for s in spec), tuple(sorted(options.items())))


def _hashable(entry):
    return tuple(_hashable(x) for x in entry) if isinstance(entry, (list, tuple)) else entry
