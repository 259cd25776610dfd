/* The CPython face of the native arena: an empty module, there only so that setuptools builds
 * tencache_ds/_tencache_arena*.so as an ordinary extension (right name, right ABI tag, installed with the
 * package). The tc_* functions in the same .so are called through ctypes (tencache_ds/memory/_native.py),
 * which keeps arena.c free of Python and lets the ctypes calls release the GIL. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef tc_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tencache_ds._tencache_arena",
    .m_doc = "Native pinned-buffer arena (csrc/arena.c). No Python methods: tencache_ds.memory._native loads "
             "this file with ctypes and calls the tc_arena_* C functions.",
    .m_size = 0,
};

PyMODINIT_FUNC PyInit__tencache_arena(void) { return PyModule_Create(&tc_module); }
