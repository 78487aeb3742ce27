"""_check.py -- argument checks run before any request: wrong types raise TypeError, wrong values
ValueError, each naming the argument and what it got."""

import re
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _tn(v: Any) -> str:
    return type(v).__name__


def string(name: str, v: Any, *, optional: bool = False, empty: bool = False) -> Optional[str]:
    if v is None:
        if optional:
            return None
        raise TypeError("%s is required (a str), got None" % name)
    if not isinstance(v, str):
        raise TypeError("%s must be a str, got %s" % (name, _tn(v)))
    if not empty and v == "":
        raise ValueError("%s must not be empty" % name)
    if "\0" in v:
        raise ValueError("%s must not contain NUL characters" % name)
    return v


def boolean(name: str, v: Any, *, optional: bool = True) -> Optional[bool]:
    if v is None and optional:
        return None
    if not isinstance(v, bool):
        raise TypeError("%s must be a bool, got %s" % (name, _tn(v)))
    return v


def integer(name: str, v: Any, lo: Optional[int] = None, hi: Optional[int] = None, *,
            optional: bool = True) -> Optional[int]:
    if v is None:
        if optional:
            return None
        raise TypeError("%s is required (an int), got None" % name)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError("%s must be an int, got %s" % (name, _tn(v)))
    if lo is not None and v < lo:
        raise ValueError("%s must be >= %d, got %d" % (name, lo, v))
    if hi is not None and v > hi:
        raise ValueError("%s must be <= %d, got %d" % (name, hi, v))
    return v


def number(name: str, v: Any, lo: Optional[float] = None, hi: Optional[float] = None, *,
           optional: bool = True) -> Optional[float]:
    if v is None:
        if optional:
            return None
        raise TypeError("%s is required (a number), got None" % name)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError("%s must be a number, got %s" % (name, _tn(v)))
    if v != v:
        raise ValueError("%s must not be NaN" % name)
    if lo is not None and v < lo:
        raise ValueError("%s must be >= %s, got %s" % (name, lo, v))
    if hi is not None and v > hi:
        raise ValueError("%s must be <= %s, got %s" % (name, hi, v))
    return v


def timeout_ms(name: str, v: Any) -> Optional[int]:
    """A timeout in seconds (int or float, > 0) as whole milliseconds (at least 1), or None."""
    s = number(name, v, lo=0)
    if s is None:
        return None
    if s <= 0:
        raise ValueError("%s must be > 0 seconds, got %s" % (name, s))
    ms = max(1, int(round(s * 1000)))
    if ms > 86400000:
        raise ValueError("%s must be at most 86400 seconds, got %s" % (name, s))
    return ms


def str_map(name: str, v: Any, *, env: bool = False) -> Optional[Dict[str, str]]:
    if v is None:
        return None
    if not isinstance(v, Mapping):
        raise TypeError("%s must be a dict of str to str, got %s" % (name, _tn(v)))
    out = {}
    for k, val in v.items():
        if not isinstance(k, str):
            raise TypeError("%s keys must be str, got %s" % (name, _tn(k)))
        if not isinstance(val, str):
            raise TypeError("%s[%r] must be a str, got %s" % (name, k, _tn(val)))
        if env and not _ENV_KEY.match(k):
            raise ValueError("%s key %r is not a valid environment variable name" % (name, k))
        out[k] = val
    return out


def command(v: Any) -> Dict[str, Union[str, List[str]]]:
    """cmd: a shell string (run by /bin/sh -c) or an argv list of str (run as is)."""
    if isinstance(v, str):
        if not v.strip():
            raise ValueError("cmd must not be empty")
        if "\0" in v:
            raise ValueError("cmd must not contain NUL characters")
        return {"cmd": v}
    if isinstance(v, (list, tuple)):
        if not v:
            raise ValueError("cmd as an argv list must not be empty")
        for i, a in enumerate(v):
            if not isinstance(a, str):
                raise TypeError("cmd[%d] must be a str, got %s" % (i, _tn(a)))
            if "\0" in a:
                raise ValueError("cmd[%d] must not contain NUL characters" % i)
        if v[0] == "":
            raise ValueError("cmd[0] (the program) must not be empty")
        return {"argv": list(v)}
    if v is None:
        raise TypeError("cmd is required: a shell string or an argv list of str")
    raise TypeError("cmd must be a str (shell command) or a list of str (argv), got %s" % _tn(v))


def str_list(name: str, v: Any) -> List[str]:
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
        raise TypeError("%s must be a list of str, got %s" % (name, _tn(v)))
    for i, a in enumerate(v):
        if not isinstance(a, str):
            raise TypeError("%s[%d] must be a str, got %s" % (name, i, _tn(a)))
    return list(v)


def callback(name: str, v: Any) -> Any:
    if v is not None and not callable(v):
        raise TypeError("%s must be callable, got %s" % (name, _tn(v)))
    return v


_TAG = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def tag(name: str, v: Any) -> Optional[str]:
    """A process tag: 1..64 of [A-Za-z0-9_.-], not all digits (those are pids), or None."""
    if string(name, v, optional=True) is None:
        return None
    if not _TAG.match(v) or v.isdigit():
        raise ValueError("%s must be 1 to 64 characters of A-Z a-z 0-9 _ . - and not all digits, got %r" % (name, v))
    return v
