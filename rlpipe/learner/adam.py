"""The optimizer step of a PPO minibatch without torch.optim's and torch.nn.utils' wrappers:
Adam as `torch.optim.Adam(params, lr, eps=eps, fused=True)` computes it, and gradient clipping
as `torch.nn.utils.clip_grad_norm_` computes it, bit for bit.

Why not torch.optim: every torch optimizer routes its constructor, `step`, `zero_grad` and
state-dict methods through `torch._disable_dynamo`, which imports `torch._dynamo` on the first
call: seconds of imports holding the GIL, in the first PPO update's thread, while the
driver's main thread is serving the workers (what it cost the quick start:
docs/benchmarks.md). clip_grad_norm_ regroups the gradients by device and dtype on every
call; the policy's are on one device, of one dtype.

The same kernel does the arithmetic: `torch._fused_adam_` over all parameters in one call,
step counts as float32 scalars (torch's fused Adam's), state created at a parameter's first
step. The state dict has torch.optim.Adam's layout (`state` by parameter index, `param_groups`
with the same keys), so checkpoints load either way, and `param_groups[0]["lr"]` is the
learning rate the learner anneals.
"""

from __future__ import annotations

import torch

BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, as the learner always used them


class FusedAdam:
    def __init__(self, params, lr: float, eps: float = 1e-8, betas: tuple[float, float] = BETAS):
        group = {
            "lr": lr,
            "betas": tuple(betas),
            "eps": eps,
            "weight_decay": 0.0,
            "amsgrad": False,
            "maximize": False,
            "foreach": None,
            "capturable": False,
            "differentiable": False,
            "fused": True,
            "decoupled_weight_decay": False,
            "params": list(params),
        }
        self.param_groups = [group]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.detach_().zero_()

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._state_of(p) for p in params]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            torch._fused_adam_(
                params,
                [p.grad for p in params],
                [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states],
                [],
                steps,
                lr=float(group["lr"]),
                beta1=beta1,
                beta2=beta2,
                weight_decay=group["weight_decay"],
                eps=group["eps"],
                amsgrad=False,
                maximize=False,
                grad_scale=None,
                found_inf=None,
            )

    def _state_of(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state.get(p)
        if state is None:
            state = self.state[p] = {
                "step": torch.zeros((), dtype=torch.float32, device=p.device),
                "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
            }
        return state

    def state_dict(self) -> dict:
        """torch.optim.Optimizer.state_dict's layout: parameters by their index over the groups."""
        index = {}
        groups = []
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            groups.append(
                {k: v for k, v in group.items() if k != "params"} | {"params": [index[id(p)] for p in group["params"]]}
            )
        state = {index[id(p)]: dict(s) for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """A state dict of this class or of torch.optim.Adam over the same parameters, in order."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups) or any(
            len(g["params"]) != len(s["params"]) for g, s in zip(self.param_groups, saved)
        ):
            raise ValueError("optimizer state of other parameter groups than this optimizer's")
        by_index = {i: p for g, s in zip(self.param_groups, saved) for i, p in zip(s["params"], g["params"])}
        self.state = {}
        for i, s in state_dict["state"].items():
            p = by_index[int(i)]
            self.state[p] = {
                "step": s["step"].detach().to(device=p.device, dtype=torch.float32).clone(),
                "exp_avg": s["exp_avg"].detach().to(device=p.device, dtype=p.dtype).clone(),
                "exp_avg_sq": s["exp_avg_sq"].detach().to(device=p.device, dtype=p.dtype).clone(),
            }
        for group, s in zip(self.param_groups, saved):
            group.update({k: v for k, v in s.items() if k != "params"})
            group["betas"] = tuple(group["betas"])


def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_(params, max_norm) for parameters on one device and of one
    dtype (the policy's): the total 2-norm of the gradients, and every gradient scaled by
    min(max_norm / (norm + 1e-6), 1) in place. The gradients hold no autograd history, so no
    grad-mode switch is needed around it."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    torch._foreach_mul_(grads, torch.clamp(float(max_norm) / (total + 1e-6), max=1.0))
    return total
