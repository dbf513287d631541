"""Build hook: compile rlpipe/native/*.pyx (the seqlock board and friends) with Cython."""
import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

extensions = [
    Extension(
        "rlpipe.native.board",
        ["rlpipe/native/board.pyx"],
        extra_compile_args=["-O3"],
        include_dirs=[numpy.get_include()],
    ),
]

setup(ext_modules=cythonize(extensions, language_level=3))
