"""Test helpers: running ranks as threads of this process over local://."""
import itertools
import os
import threading

import sx

_names = itertools.count()


def rendezvous():
    """A local:// name no other group of this process uses."""
    return f"local://pytest-{os.getpid()}-{next(_names)}"


def run_ranks(world_size, fn, *args):
    """Runs fn(rank, rendezvous, *args) on `world_size` threads; returns the results by
    rank, or raises the first rank's exception."""
    name = rendezvous()
    results, errors = [None] * world_size, [None] * world_size

    def body(rank):
        try:
            results[rank] = fn(rank, name, *args)
        except BaseException as e:
            errors[rank] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # A rank that failed first makes its peers fail with communication errors: report
    # the first error that is not one of those.
    failed = [e for e in errors if e is not None]
    consequences = (sx.CommError, sx.AbortedError, sx.SxTimeoutError, sx.GroupFailedError)
    for e in sorted(failed, key=lambda e: isinstance(e, consequences)):
        raise e
    return results


def tolist(view):
    """A view's values as a flat list of Python floats (numpy array or memoryview)."""
    values = view.tolist()
    flat = []
    stack = [values]
    while stack:  # flatten nested lists in order
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            flat.append(item)
    return flat


def fill(view, values):
    """Writes a flat sequence into a view of any shape (numpy array or memoryview)."""
    flat = view.reshape(-1) if hasattr(view, "reshape") else view.cast("B").cast(view.format)
    for k, v in enumerate(values):
        flat[k] = v
