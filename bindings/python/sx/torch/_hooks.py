"""ShardedOptimizer's autograd and module hooks: each param's post-accumulate-grad hook
(the params a step updates; with overlap, each unit's reduction started as soon as its
gradients are complete) and, at stage 3, the params gathered around each module's
forward and backward and released after, as FSDP."""
import contextlib

import torch


class _Hooks:
    """ShardedOptimizer's part that hooks params and modules, and holds stage 3's gathered
    units (the constructor sets _unit_params, _gathered, _backward, _peak, _whole,
    _waiting, _touched and _unhooked)."""

    def _hook_new(self):
        """Hooks the params that require a gradient and have no hook yet (a param frozen
        when it was bound has none until it is unfrozen: torch refuses hooks on tensors that
        do not require gradients). True if there was one."""
        if not self._hooks:
            return False
        now = [i for i in self._unhooked if self._params[i].requires_grad]
        for i in now:
            self._params[i].register_post_accumulate_grad_hook(lambda _p, i=i: self._accumulated(i))
            self._unhooked.discard(i)
        return bool(now)

    def _expect(self):
        """Overlap: the params whose gradients each unit waits for in the next backward."""
        self._waiting = {}
        for i, p in enumerate(self._params):
            if p.requires_grad:
                self._waiting.setdefault(self._units[i], set()).add(i)

    def _accumulated(self, i):
        self._clean = False
        self._touched[i] = True
        if self._stage == 3:
            self._backward_done(i)
        if not self._overlap or self._no_sync:
            return
        unit = self._units[i]
        waiting = self._waiting.get(unit)
        if waiting is None or i not in waiting:
            # sx is reducing this unit already: a second backward would race with it.
            raise RuntimeError(f"sx.torch: a second gradient of {self._names[i]} before step(); with overlap=True "
                               "every backward must be followed by step() (a step skipped, as GradScaler skips "
                               "one after an overflow, leaves the reduction of the first backward open)")
        waiting.discard(i)
        if not waiting:
            del self._waiting[unit]
            self.group.unit_grads_ready(unit)

    # -- stage 3 -------------------------------------------------------------------------
    # A param keeps a storage of its own, of full size only while one of its modules runs
    # (forward or backward): gathering its unit copies sx's gathered values into it, then
    # sx releases the unit at once; releasing the param resizes its storage to nothing, as
    # FSDP does (views taken in the forward, which the backward reads, share the storage).
    # Its .grad is a view of sx's gradient buffer, which stays whole.
    def _bind_sharded(self, first, sync):
        """Unit by unit (so that no rank holds more than its shards and one unit): gathered,
        the params' values written in (and broadcast from rank 0 where `sync`: the units
        rank 0 holds gathered, this one), released."""
        by_unit = {}
        for i in range(first, len(self._params)):
            by_unit.setdefault(self._units[i], []).append(i)
        # Units in id order, which need not be the params' (an auto-wrap policy's root unit
        # holds params of the start and of the end): the lists by param index.
        self._grads.extend([None] * (len(self._params) - first))
        self._touched.extend([not self._skip_unreached] * (len(self._params) - first))
        for u in sorted(by_unit):
            self.group.gather_unit(u)
            for i in by_unit[u]:
                p = self._params[i]
                with torch.no_grad():
                    self._tensor(self.group.param_view(i), p).copy_(p.data)
                    if p.untyped_storage().nbytes() != p.numel() * p.element_size() or p.storage_offset() != 0:
                        p.data = p.data.clone()  # a storage of its own, to resize
                    grad = self._tensor(self.group.grad_view(i), p)
                    grad.zero_()
                p.grad = grad
                self._grads[i] = grad
                self._unhooked.add(i)
                self._unit_params.setdefault(u, []).append(i)
            if sync:
                self.group.broadcast_params(0)
            self.group.release_unit(u)
            self._free(u)

    def _gather(self, u):
        """Unit u's params present (nested: each needs its _release)."""
        self._gathered[u] = self._gathered.get(u, 0) + 1
        if self._gathered[u] > 1:
            return
        self.group.gather_unit(u)
        try:
            with torch.no_grad():
                for i in self._unit_params[u]:
                    p = self._params[i]
                    p.untyped_storage().resize_(p.numel() * p.element_size())
                    # Through an alias of the storage: the param's version stays, so that
                    # autograd still takes what its forward saved of it.
                    alias = torch.empty(0, dtype=p.dtype).set_(p.untyped_storage(), 0, p.shape, p.stride())
                    alias.copy_(self._tensor(self.group.param_view(i), p))
        finally:
            self.group.release_unit(u)
        if not self._whole:
            self._peak = max(self._peak, sum(self._unit_bytes_of(v) for v in self._gathered))

    def _release(self, u):
        self._gathered[u] -= 1
        if self._gathered[u] == 0:
            del self._gathered[u]
            self._free(u)

    def _free(self, u):
        for i in self._unit_params[u]:
            self._params[i].untyped_storage().resize_(0)

    def _unit_bytes_of(self, u):
        return sum(self._params[i].numel() * self._params[i].element_size() for i in self._unit_params[u])

    @property
    def peak_param_bytes(self):
        """Stage 3: the most bytes of full params this process held at once in its
        modules' storages for their forwards and backwards (not inside full_params(); sx's
        own shards and gathers are in group.memory_stats())."""
        return self._peak

    @contextlib.contextmanager
    def full_params(self):
        """Stage 3: every param present (whole) inside the block, e.g. to read or save the
        model; writes into them are not kept. Collective. Elsewhere nothing to do."""
        if self._stage != 3:
            yield
            return
        units = sorted(self._unit_params)
        self._whole = True
        try:
            for u in units:
                self._gather(u)
            yield
        finally:
            for u in units:
                if u in self._gathered:
                    self._release(u)
            self._whole = False

    def _hook_modules(self, module):
        """Stage 3: each module that holds params gathers their units before its forward
        and its backward, and releases them after (the backward's as each unit's
        gradients are all accumulated)."""
        index = {id(p): i for i, p in enumerate(self._params)}
        if self._wrapped is not None:  # the modules that own the policy's units
            hooked = [(m, [u]) for u, m in sorted(self._wrap_owners.items())]
        else:  # every module holding params directly
            hooked = []
            for m in module.modules():
                units = sorted({self._units[index[id(p)]] for p in m.parameters(recurse=False) if id(p) in index})
                if units:
                    hooked.append((m, units))
        for m, units in hooked:

            def pre(_m, _args, units=units):
                for u in units:
                    self._gather(u)

            def post(_m, _args, _out, units=units):
                for u in units:
                    self._release(u)

            def backward_pre(_m, _grad_out, units=units):
                for u in units:
                    if u in self._backward:
                        continue
                    waiting = {i for i in self._unit_params[u] if self._params[i].requires_grad}
                    if waiting:
                        self._backward[u] = waiting
                        self._gather(u)

            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post)
            m.register_full_backward_pre_hook(backward_pre)

    def _backward_done(self, i):
        """Stage 3: param i's gradient is accumulated; its unit is released once all its
        params' are."""
        u = self._units[i]
        waiting = self._backward.get(u)
        if waiting is None:
            return
        waiting.discard(i)
        if not waiting:
            del self._backward[u]
            self._release(u)

    def _release_backward(self):
        """Stage 3: units gathered for a backward that did not reach all their params."""
        for u in list(self._backward):
            del self._backward[u]
            self._release(u)
