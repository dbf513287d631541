"""How often noise alone reaches MountainCarContinuous's flag: the figures behind its node's
`log_std_init` (docs/multitask.md, "Specialists").

    python benchmarks/mountaincar_noise.py [--episodes 4000] [--seed 0]

The env's dynamics (Gymnasium 1.x `Continuous_MountainCarEnv`: force x 0.0015 against gravity
0.0025 cos(3x), speed clipped to 0.07, the left wall stops the car, the flag at x >= 0.45,
999 steps), vectorized over episodes in numpy. The actions are a policy that has learned
nothing: a Gaussian around 0 with the given std, clipped to [-1, 1] as rlpipe's continuous
head is (rlpipe/envs/classic.py), drawn every step (PPO's own noise) or held for 4 or 16
steps (what gSDE's `sde_sample_freq` gives). Prints, per std and hold, the fraction of
episodes that reach the flag and their median step of arrival.
"""

from __future__ import annotations

import argparse

import numpy as np

STEPS = 999  # the env's time limit
POWER, GRAVITY, MAX_SPEED = 0.0015, 0.0025, 0.07
MIN_X, MAX_X, GOAL_X = -1.2, 0.6, 0.45


def reach(std: float, hold: int, episodes: int, seed: int) -> tuple[float, float | None]:
    """(fraction of episodes at the flag within STEPS, median step of arrival)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-0.6, -0.4, episodes)
    v = np.zeros(episodes)
    arrived = np.full(episodes, -1)
    a = np.zeros(episodes)
    for t in range(STEPS):
        if t % hold == 0:
            a = np.clip(rng.normal(0.0, std, episodes), -1.0, 1.0)
        v = np.clip(v + a * POWER - GRAVITY * np.cos(3 * x), -MAX_SPEED, MAX_SPEED)
        x = np.clip(x + v, MIN_X, MAX_X)
        v = np.where((x == MIN_X) & (v < 0), 0.0, v)
        arrived[(x >= GOAL_X) & (arrived < 0)] = t
    hit = arrived >= 0
    return float(hit.mean()), (float(np.median(arrived[hit])) if hit.any() else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print("| log std | std | hold (steps) | episodes at the flag | median arrival step |")
    print("|---|---|---|---|---|")
    for hold in (1, 4, 16):
        for log_std in (-1.0, 0.0, 1.0, 2.0):
            frac, median = reach(float(np.exp(log_std)), hold, args.episodes, args.seed)
            arrival = f"{median:.0f}" if median is not None else "-"
            print(f"| {log_std:g} | {np.exp(log_std):.2f} | {hold} | {100 * frac:.1f} % | {arrival} |")


if __name__ == "__main__":
    main()
