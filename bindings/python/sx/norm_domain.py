"""NormDomain: the groups of every model-parallel slice joined, so that each step's
gradient norm, non-finite check and loss-scale decision are taken over all of them
(include/sx/sx_step.h, docs/model-parallel.md)."""
import ctypes

from . import _lib
from ._handle import Handle
from ._lib import lib
from .errors import check
from .group import _TRANSPORTS, _choice, _encode


class NormDomain(Handle):
    """This rank's handle of a norm domain over every rank of a model-parallel trainer
    (tensor-parallel x pipeline x data-parallel ranks). Creating it is collective, as a
    :class:`ShardGroup` is: every rank of ``world_size`` makes it through ``rendezvous``
    (or in ``context`` under ``name``). Each rank then joins its own group with
    :meth:`ShardGroup.join_norm_domain` and the index of its slice.

    Lifetime: the groups joined to it keep it alive; :meth:`close` (or the end of a
    ``with`` block, or the finalizer) releases this handle only."""

    def __init__(self, rendezvous=None, rank=0, world_size=1, *, timeout_ms=0, transport="auto",
                 context=None, name=None):
        cfg = _lib.init_struct(_lib.sx_group_config_t)
        if rendezvous is not None:
            cfg.rendezvous = _encode("rendezvous", rendezvous)
        if context is not None:
            cfg.context = context.handle
            cfg.name = _encode("name", name or "")
        else:
            cfg.rank, cfg.world_size = rank, world_size
        cfg.timeout_ms = timeout_ms
        cfg.transport = _choice("transport", transport, _TRANSPORTS)
        handle = _lib.sx_norm_domain_p()
        check(lib.sx_create_norm_domain(ctypes.byref(cfg), ctypes.byref(handle)))
        self._own(handle, lib.sx_destroy_norm_domain)

    def __repr__(self):
        return "<sx.NormDomain closed>" if self.closed else "<sx.NormDomain>"
