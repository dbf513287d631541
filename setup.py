"""Build hook: compile rlpipe/native/*.pyx (the seqlock board, the worker step loop, the
worker's per-slice statistics, the doorbells, the driver's span copies, PPO's
kernels) with Cython."""

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# The C headers and Cython declarations (.pxd) an extension includes: a change to one rebuilds
# it, and an sdist carries them.
HEADERS = {
    "board": ("board_rows.h", "board_seqlock.h", "board_lock.h"),
    "steploop": ("gymstep.pxd",),
    "ppokernels": ("ppokernels.h",),
}

extensions = [
    Extension(
        f"rlpipe.native.{name}",
        [f"rlpipe/native/{name}.pyx"],
        depends=[f"rlpipe/native/{header}" for header in HEADERS.get(name, ())],
        # no fused multiply-add even where CFLAGS allow it: the worker's kernels promise numpy's
        # bits (one rounding per operation, rlpipe/native/slicestats.pyx)
        extra_compile_args=["-O3", "-ffp-contract=off"],
        include_dirs=[numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for name in ("board", "gymstep", "steploop", "slicestats", "bell", "spans", "ppokernels")
]

setup(ext_modules=cythonize(extensions, language_level=3))
