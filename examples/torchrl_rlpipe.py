"""TorchRL's PPO on rlpipe.vector: TorchRL's own pieces (GymWrapper, Collector, GAE,
ClipPPOLoss) over envs stepped by rlpipe's workers. `pip install rlpipe[torchrl]`, then

    python examples/torchrl_rlpipe.py [--env CartPole-v1] [--num-envs 8] [--iters 60] [--torch-threads 1]

prints each batch's mean return of the episodes that ended in it, and how many steps were
cut by a fault (an env that raised, hung or broke the contract: rebuilt by its worker,
reported as a truncation with "rlpipe_fault" set). Any Gymnasium id with a Discrete action
space, or an rlpipe env type (e.g. `--env faulty`), works.
"""

from __future__ import annotations

import argparse

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from rlpipe.vector.torchrl_env import FAULT_KEY, make_env


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--steps-per-batch", type=int, default=1024)
    p.add_argument("--iters", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    # torch's default (a thread per core) leaves rlpipe's workers no core on a small machine
    p.add_argument("--torch-threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)

    env = make_env(args.env, args.num_envs, seed=args.seed)  # TorchRL's GymWrapper over rlpipe.vector
    try:
        obs_dim = env.observation_spec["observation"].shape[-1]
        n_actions = env.action_spec.shape[-1]
        logits = TensorDictModule(
            nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, n_actions)),
            in_keys=["observation"],
            out_keys=["logits"],
        )
        actor = ProbabilisticActor(
            logits,
            in_keys=["logits"],
            distribution_class=OneHotCategorical,
            spec=env.action_spec,
            return_log_prob=True,
        )
        critic = ValueOperator(
            nn.Sequential(nn.Linear(obs_dim, 64), nn.Tanh(), nn.Linear(64, 1)), in_keys=["observation"]
        )
        advantage = GAE(gamma=0.99, lmbda=0.95, value_network=critic)
        loss = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.0)
        optim = torch.optim.Adam(loss.parameters(), lr=2.5e-3)
        collector = Collector(
            env,
            actor,
            frames_per_batch=args.steps_per_batch,
            total_frames=args.steps_per_batch * args.iters,
            auto_register_policy_transforms=False,  # the MLP policy needs no InitTracker
        )
        returns = torch.zeros(args.num_envs)
        for i, batch in enumerate(collector):
            # episode returns from the batch's rewards (batch: [num_envs, steps])
            ended = []
            for t in range(batch.shape[1]):
                returns += batch["next", "reward"][:, t, 0]
                done = batch["next", "done"][:, t, 0]
                ended += returns[done].tolist()
                returns[done] = 0.0
            faults = int(batch["next", FAULT_KEY].sum())
            for _ in range(4):  # epochs over the batch, in 4 minibatches each
                with torch.no_grad():
                    advantage(batch)
                flat = batch.reshape(-1)
                for idx in torch.randperm(flat.numel()).chunk(4):
                    losses = loss(flat[idx])
                    total = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                    optim.zero_grad()
                    total.backward()
                    nn.utils.clip_grad_norm_(loss.parameters(), 0.5)
                    optim.step()
            collector.update_policy_weights_()
            mean = sum(ended) / len(ended) if ended else float("nan")
            print(f"batch {i + 1}: {len(ended)} episodes ended, mean return {mean:.1f}, faults {faults}", flush=True)
        collector.shutdown()
    finally:
        env.close()


if __name__ == "__main__":
    main()
