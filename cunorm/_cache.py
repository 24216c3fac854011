"""The bounded dictionary behind every per-geometry cache (plans, the attention call memo).

A cache keyed by shapes grows with every new geometry a program makes: a decoding loop whose
KV cache grows by a key each step, or row counts that follow the data, would add an entry
per call without end. :class:`BoundedCache` keeps at most ``limit`` entries and drops the
oldest on insertion. Lookups stay ``dict.get`` (not overridden), so a hit costs what a plain
dict's does; a geometry dropped and met again is only planned again. Insertions (cache
misses, rare) take a lock: picking the oldest entry and deleting it are two steps, which
threads inserting at once would otherwise interleave.
"""

from __future__ import annotations

import threading

#: Entries each cache keeps. A plan or memoized call is a few kilobytes (an attention launch
#: holds two argument records), so a full cache stays within a few megabytes.
CACHE_LIMIT = 1024


class BoundedCache(dict):
    """A dict that holds at most ``limit`` entries, dropping the oldest inserted one first.

    Parameters
    ----------
    limit : int
        Largest number of entries kept (>= 1).

    Examples
    --------
    >>> c = BoundedCache(2)
    >>> c["a"], c["b"], c["c"] = 1, 2, 3
    >>> list(c), c.get("a")
    (['b', 'c'], None)
    """

    __slots__ = ("limit", "_lock")

    def __init__(self, limit: int = CACHE_LIMIT) -> None:
        if not isinstance(limit, int) or limit < 1:
            raise ValueError(f"BoundedCache(): limit must be an int >= 1, got {limit!r}")
        super().__init__()
        self.limit = limit
        self._lock = threading.Lock()

    def __setitem__(self, key, value) -> None:
        with self._lock:
            while key not in self and len(self) >= self.limit:
                try:  # dicts keep insertion order: the oldest first
                    self.pop(next(iter(self)), None)
                except (RuntimeError, StopIteration):  # a clear() (unlocked) under way
                    continue
            super().__setitem__(key, value)
