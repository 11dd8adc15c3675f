# SPDX-License-Identifier: MIT
"""The ctypes binding of libchime: the C prototypes, and where the library is."""
import ctypes
import ctypes.util
import os

# libchime's soname (libclient/meson.build: soversion '0'): the ABI this
# module was written against, not whichever libchime.so a -dev package links.
SONAME = "libchime.so.0"


class ChimeOpts(ctypes.Structure):
    # chime_open@@CHIME_0.3 (the version dlsym finds) reads session too.
    _fields_ = [("socket_path", ctypes.c_char_p), ("flags", ctypes.c_uint),
                ("session", ctypes.c_char_p)]


class ChimeEvent(ctypes.Structure):
    _fields_ = [
        ("id", ctypes.c_uint64),
        ("key", ctypes.c_uint64),
        ("user_data", ctypes.c_uint64),
        ("deadline_ns", ctypes.c_uint64),
        ("fired_ns", ctypes.c_uint64),
    ]


class ChimeOp(ctypes.Structure):
    # struct chime_op (chime_submit, CHIME_0.2)
    _fields_ = [
        ("op", ctypes.c_uint32),
        ("result", ctypes.c_int32),
        ("id", ctypes.c_uint64),
        ("key", ctypes.c_uint64),
        ("deadline_ns", ctypes.c_uint64),
        ("period_ns", ctypes.c_uint64),
        ("user_data", ctypes.c_uint64),
    ]


def _load():
    # $CHIME_LIBRARY: a build tree's libchime.so (the tests use it).
    path = os.environ.get("CHIME_LIBRARY") or SONAME
    try:
        return ctypes.CDLL(path, use_errno=False)
    except OSError as e:
        found = None if os.environ.get("CHIME_LIBRARY") else ctypes.util.find_library("chime")
        if found:
            try:
                return ctypes.CDLL(found)
            except OSError as e2:
                e = e2      # say why the one found failed too, with the hint below
        raise ImportError(
            f"chime: cannot load {path} ({e}); install libchime (meson install, then "
            f"ldconfig) or set CHIME_LIBRARY to its path") from None


lib = _load()

_u64 = ctypes.c_uint64
_p = ctypes.c_void_p
_sigs = {
    "chime_open": (ctypes.c_int, [ctypes.POINTER(_p), ctypes.POINTER(ChimeOpts)]),
    "chime_close": (None, [_p]),
    "chime_now": (_u64, []),
    "chime_version": (ctypes.c_char_p, []),
    "chime_arm": (ctypes.c_int, [_p, _u64, _u64, _u64, _u64, ctypes.POINTER(_u64)]),
    "chime_arm_realtime": (ctypes.c_int, [_p, _u64, _u64, _u64, _u64, ctypes.POINTER(_u64)]),
    "chime_reset": (ctypes.c_int, [_p, _u64, _u64]),
    "chime_cancel": (ctypes.c_int, [_p, _u64]),
    "chime_cancel_key": (ctypes.c_int, [_p, _u64]),
    "chime_flush": (ctypes.c_int, [_p]),
    "chime_submit": (ctypes.c_int, [_p, ctypes.POINTER(ChimeOp), ctypes.c_uint]),
    "chime_fd": (ctypes.c_int, [_p]),
    "chime_poll": (ctypes.c_int, [_p, ctypes.POINTER(ChimeEvent), ctypes.c_uint]),
    "chime_wait": (ctypes.c_int, [_p, ctypes.POINTER(ChimeEvent), ctypes.c_uint, ctypes.c_int]),
    "chime_drop_session": (ctypes.c_int, [ctypes.POINTER(ChimeOpts)]),
}
for _name, (_res, _args) in _sigs.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args
