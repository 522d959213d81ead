"""torch.nn.utils.clip_grad_norm_ over an sx.torch optimizer's params warns (once) that
it clips each process's own gradients. Importing sx.torch (which imports this module)
puts the wrapper in place of torch's function."""
import functools
import warnings
import weakref

import torch

# Every live ShardedOptimizer (what the clip_grad_norm_ check looks at).
_live = weakref.WeakSet()


# torch.nn.utils.clip_grad_norm_ over params whose gradients sx holds, with several
# processes, clips each process's own gradients before sx averages them: not the global
# norm DDP clips. It still runs as torch's, but warns once (names imported from torch
# before sx.torch was are not wrapped).
_torch_clip_grad_norm_ = torch.nn.utils.clip_grad_norm_
_clip_warned = False


@functools.wraps(_torch_clip_grad_norm_)
def _clip_grad_norm_(parameters, *args, **kwargs):
    global _clip_warned
    if not _clip_warned:
        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        held = {id(g) for opt in list(_live) if opt._world > 1 for g in opt._grads}
        if held and any(p.grad is not None and id(p.grad) in held for p in parameters):
            _clip_warned = True
            warnings.warn("torch.nn.utils.clip_grad_norm_ over params of an sx.torch.ShardedOptimizer clips this "
                          "process's own gradients, before sx averages them over the processes (DDP clips the "
                          "averaged ones): pass max_grad_norm to the optimizer, or call opt.clip_grad_norm_(...), "
                          "which clips the global norm at the step", stacklevel=2)
    return _torch_clip_grad_norm_(parameters, *args, **kwargs)


torch.nn.utils.clip_grad_norm_ = _clip_grad_norm_
torch.nn.utils.clip_grad.clip_grad_norm_ = _clip_grad_norm_
