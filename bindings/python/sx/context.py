"""Context: many shard groups on one rendezvous, one transport and one thread pool
(include/sx/sx_context.h)."""
import ctypes
import dataclasses

from . import _lib
from ._handle import Handle
from ._lib import lib
from .errors import check
from .group import _BACKENDS, _TRANSPORTS, ShardGroup, _choice, _encode


@dataclasses.dataclass(frozen=True)
class ContextStats:
    """What a context holds on this rank now (sx_context_stats_t): its live groups, the
    groups made in it since its creation, the channels open on its transport (a group
    has 1 or more), the bytes its groups hold as the budget counts them, the budget (0: none),
    whether its channels share memory (every rank on this host, or within each of
    several hosts of as many ranks), and the bytes its Gloo channels keep on this rank
    between their calls (blocks their calls reuse, and what calls that ended early left;
    not in memory_bytes)."""
    groups: int
    groups_created: int
    channels: int
    memory_bytes: int
    memory_budget_bytes: int
    shared_memory: bool
    transport_bytes: int


class Context(Handle):
    """This rank's handle of a context: what the groups made in it on the same ranks
    share (the rendezvous, the transport and the thread pool), as a fine-tune service
    runs many tenants' jobs on the same ranks.

    Creating one is collective, as a :class:`ShardGroup` is: every rank of
    ``world_size`` makes it through ``rendezvous``. The arguments are ShardGroup's of
    the same names; ``memory_budget_bytes`` (0: none) caps what the context's groups may
    hold on this rank: a finalize that would exceed it raises OutOfMemoryError before
    anything is allocated.

    Make groups in it with :meth:`group` (or ``ShardGroup(context=ctx, name=...)``):
    each needs a name, the same on every rank, that no live group of the context has
    (InvalidStateError otherwise); it takes the context's rendezvous, ranks, backend,
    pool, timeout and transport, and opens no connection of its own. The groups keep
    their failures, checkpoints and memory to themselves.

    Lifetime: the context lives while any group made in it does. :meth:`close` (or the
    end of a ``with`` block, or the finalizer as a safety net) releases this handle only:
    the groups already made go on, and the context closes with the last of them; no new
    group can be made in it. :meth:`stats` may be called from any thread.
    """

    def __init__(self, rendezvous, rank=0, world_size=1, *, backend="auto", num_threads=0, timeout_ms=0,
                 transport="auto", bind_address=None, rendezvous_token=None, rendezvous_bind=None,
                 device_ordinal=0, memory_budget_bytes=0):
        cfg = _lib.init_struct(_lib.sx_context_config_t)
        cfg.rendezvous = _encode("rendezvous", rendezvous)
        cfg.rank, cfg.world_size = rank, world_size
        cfg.backend = _choice("backend", backend, _BACKENDS)
        cfg.transport = _choice("transport", transport, _TRANSPORTS)
        cfg.num_threads, cfg.timeout_ms = num_threads, timeout_ms
        if bind_address is not None:
            cfg.bind_address = _encode("bind_address", bind_address)
        if rendezvous_token is not None:
            cfg.rendezvous_token = _encode("rendezvous_token", rendezvous_token)
        if rendezvous_bind is not None:
            cfg.rendezvous_bind = _encode("rendezvous_bind", rendezvous_bind)
        cfg.device_ordinal = device_ordinal
        cfg.memory_budget_bytes = memory_budget_bytes
        handle = _lib.sx_context_p()
        check(lib.sx_create_context(ctypes.byref(cfg), ctypes.byref(handle)))
        self._own(handle, lib.sx_destroy_context)

    def close(self):
        """Releases this handle. Idempotent. The groups made in the context go on (it
        closes with the last of them); no new group can be made in it."""
        super().close()

    def __repr__(self):
        if self.closed:
            return "<sx.Context closed>"
        s = self.stats()
        return f"<sx.Context {s.groups} groups, {s.memory_bytes} bytes>"

    def group(self, name, **kwargs):
        """Collective: a new :class:`ShardGroup` named `name` in this context (every rank
        passes the same name). ``kwargs`` are ShardGroup's (stage, alignment, the mixed
        precision and trace settings, ...); those the context owns (rendezvous, ranks,
        backend, num_threads, timeout_ms, transport, the addresses, the token,
        device_ordinal) are left out or equal to the context's."""
        return ShardGroup(context=self, name=name, **kwargs)

    def stats(self):
        """A :class:`ContextStats` of this rank now. Any thread."""
        stats = _lib.init_struct(_lib.sx_context_stats_t)
        check(lib.sx_get_context_stats(self.handle, ctypes.byref(stats)))
        return ContextStats(groups=stats.groups, groups_created=stats.groups_created, channels=stats.channels,
                            memory_bytes=stats.memory_bytes, memory_budget_bytes=stats.memory_budget_bytes,
                            shared_memory=bool(stats.shared_memory), transport_bytes=stats.transport_bytes)
