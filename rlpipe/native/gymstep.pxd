# The bare Gymnasium step of rlpipe/native/gymstep.pyx, for the step loop to call in C.

cdef class DiscreteBoxStep:
    cdef object bare            # the bare env's step
    cdef tuple acts             # the int64 scalar of each action in range
    cdef Py_ssize_t n
    cdef long long start
    cdef public long long elapsed
    cdef double limit
    cdef readonly object key

    cdef tuple step(self, object action)
