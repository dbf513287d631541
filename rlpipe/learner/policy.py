"""Actor-critic over the run's obs spec and unified action spec, aware of each row's env type.

One policy serves every type of a mix, so nothing one type produces may land on another
type's weights unasked, and no type's scale may set another's (docs/architecture.md,
"One policy over many types"):

- **Input**: the low-dimensional keys (`state`, `vector`, masked to the keys the type
  produces) and, for types with `rgb`, a shared CNN's features, go through a *per-type*
  input layer. CartPole's 4 numbers and Acrobot's 6 share the `state` key on the board, but
  each type has its own first-layer weights for them.
- **Trunk**: the hidden layers after the first are shared by all types.
- **Heads**: per-type output layers: discrete logits (entries past the type's action count
  masked), the Gaussian mean (dims past its count left out of the log-prob and entropy), a
  per-type log-std, and one value output per type (`PopArt` keeps each type's value in its
  own normalized scale).

Actor and critic are separate towers, as in CleanRL's ppo.py (orthogonal init, tanh, 0.01
actor gain). With one type this is exactly CleanRL's network. The towers' tanh (with each
hidden layer's bias) and the categorical head's log-prob, entropy and sampling are
rlpipe/learner/ppo_kernels.py's: one native call each on a CPU learner, the same functions in
acting and in training.

Batching by type uses index ops only: rows are put in type order once per forward (a stable
argsort), each per-type layer runs one matmul per type *segment*, and outputs are put back
in row order at the end; a batch of one type skips the permutation.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal
from torch.nn import functional as F

from rlpipe.envs.contract import CONTINUOUS
from rlpipe.envs.registry import MixPlan
from rlpipe.learner import one_type_tower
from rlpipe.learner.popart import PopArt
from rlpipe.learner.ppo_kernels import Tanh, bias_tanh, categorical_logp_entropy, categorical_sample, log_prob_at
from rlpipe.learner.rgb_encoder import ImageRows, RgbEncoder, layer_init

MASKED_LOGIT = -1e9


class ActOut(NamedTuple):
    a_disc: torch.Tensor  # [B] int64   policy sample
    a_cont: torch.Tensor  # [B, D]      policy sample (unclipped)
    logp: torch.Tensor  # [B]         log pi(a)
    value: torch.Tensor  # [B]         in return space (PopArt statistics applied)
    alt_disc: torch.Tensor  # [B] int64   uniform over the env type's valid actions
    alt_cont: torch.Tensor  # [B, D]      uniform over [-1, 1) on valid dims, 0 elsewhere
    alt_logp: torch.Tensor  # [B]         log pi(alt)


class TypeOrder(NamedTuple):
    """Rows in type order: `perm` sorts rows by type (None: already one type, in order),
    `segments` are (type, start, end) runs over the sorted rows."""

    perm: torch.Tensor | None
    inverse: torch.Tensor | None
    types: torch.Tensor  # per sorted row
    segments: tuple[tuple[int, int, int], ...]

    @classmethod
    def of(cls, types: torch.Tensor) -> "TypeOrder":
        n = len(types)
        if n == 0:
            return cls(None, None, types, ())
        first = int(types[0])
        if bool((types == first).all()):
            return cls(None, None, types, ((first, 0, n),))
        perm = torch.argsort(types, stable=True)
        sorted_types = types[perm]
        counts = torch.bincount(sorted_types).tolist()
        segments, start = [], 0
        for t, c in enumerate(counts):
            if c:
                segments.append((t, start, start + c))
                start += c
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(n, device=perm.device)
        return cls(perm, inverse, sorted_types, tuple(segments))

    def sort(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.perm is None else x[self.perm]

    def unsort(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.inverse is None else x[self.inverse]


class TypedLinear(nn.Module):
    """One Linear layer per env type, applied to type-sorted rows segment by segment.

    `in_widths`: each type's leading input columns that can be nonzero (None: all). The rest
    are the board's zero padding (a CartPole's 4 state numbers in day4's 32) or keys the type
    does not produce, so they add nothing to the output and get no gradient; the layer
    multiplies the type's own columns alone: the same sums without their zero terms (a float
    sum may round otherwise where a kernel orders it otherwise), at a fraction of the work
    (docs/benchmarks.md, "The type's own input columns")."""

    def __init__(self, n_types: int, n_in: int, n_out: int, std: float, in_widths: tuple[int, ...] | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_types, n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(n_types, n_out))
        for t in range(n_types):
            nn.init.orthogonal_(self.weight.data[t], std)
        self.in_widths = tuple(min(int(w), n_in) for w in in_widths) if in_widths is not None else (n_in,) * n_types

    def forward(self, x: torch.Tensor, order: TypeOrder, tanh: bool = False) -> torch.Tensor:
        """The layer's output, or with `tanh` its activation: for one type's rows bias_tanh
        (the bias added in the tanh's pass), for several one tanh over the joined parts (a
        native call and an autograd node per type cost day4's twelve types more than the
        bias's pass saves: docs/benchmarks.md, "The bias in the tanh kernel")."""
        if not order.segments:
            return x.new_zeros(0, self.weight.shape[1])
        # split and unbind: in training, one backward op each (a cat, a stack) where a slice per
        # segment and type made a zero-filled gradient of the whole x and weight per segment;
        # one segment is x itself (a split of one part would cost a copy of x's gradient)
        rows = (x,) if len(order.segments) == 1 else x.split([b - a for _, a, b in order.segments])
        weight, bias, widths, n_in = self.weight.unbind(), self.bias.unbind(), self.in_widths, self.weight.shape[2]
        fused = tanh and len(rows) == 1
        parts = []
        for r, (t, _, _) in zip(rows, order.segments):
            w = weight[t] if widths[t] == n_in else weight[t][:, : widths[t]]
            r = r if widths[t] == n_in else r[:, : widths[t]]
            parts.append(bias_tanh(F.linear(r, w), bias[t]) if fused else F.linear(r, w, bias[t]))
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return Tanh()(out) if tanh and not fused else out


class Tower(nn.Module):
    """Per-type input layer -> shared hidden layers -> per-type output layer."""

    def __init__(
        self,
        n_types: int,
        n_in: int,
        hidden: tuple[int, ...],
        n_out: int,
        out_std: float,
        in_widths: tuple[int, ...] | None = None,
    ):
        super().__init__()
        self.inp = TypedLinear(n_types, n_in, hidden[0], np.sqrt(2), in_widths)
        trunk, width = [], hidden[0]
        for h in hidden[1:]:
            trunk += [layer_init(nn.Linear(width, h)), Tanh()]
            width = h
        # Linear, Tanh pairs: the layout (and the parameter names) checkpoints have; forward
        # computes each pair as bias_tanh of the Linear's bias-free product
        self.trunk = nn.Sequential(*trunk)
        self.out = TypedLinear(n_types, width, n_out, out_std)

    def forward(self, x: torch.Tensor, order: TypeOrder) -> torch.Tensor:
        if one_type_tower.applies(self, x, order.segments):  # training on one type's rows
            return one_type_tower.one_type_tower(self, x, order.segments[0][0])
        return self.layer_by_layer(x, order)

    def layer_by_layer(self, x: torch.Tensor, order: TypeOrder) -> torch.Tensor:
        h = self.inp(x, order, tanh=True)
        for linear in self.trunk[::2]:
            h = bias_tanh(F.linear(h, linear.weight), linear.bias)
        return self.out(h, order)


def feature_widths(plan: MixPlan, obs_keys, rgb_out: int) -> tuple[int, ...]:
    """Each type's leading feature columns that can be nonzero (Policy.features: the keys in
    board order, each flattened, rgb as the encoder's `rgb_out` features): up to the end of
    the values it writes into the last key it produces; after them come only the board's zero
    padding and keys it does not produce (zeros, masked)."""
    widths = []
    for spec in plan.specs:
        end = offset = 0
        for k in obs_keys:
            size = rgb_out if k.name == "rgb" else math.prod(k.shape)
            if k.name in spec.obs:
                end = offset + (size if k.name == "rgb" else math.prod(spec.obs[k.name][0]))
            offset += size
        widths.append(end)
    return tuple(widths)


def _key_rows(has: torch.Tensor, n_rows: int, name: str) -> torch.Tensor:
    """The samples whose type produces a key; a key's rows are one per sample or one per
    such sample, and nothing else."""
    rows = has.nonzero(as_tuple=True)[0]
    if n_rows not in (len(has), len(rows)):
        raise ValueError(
            f"obs key {name!r}: {n_rows} rows for {len(has)} samples, {len(rows)} of them of types that produce it"
        )
    return rows


class Policy(nn.Module):
    def __init__(
        self,
        plan: MixPlan,
        obs_keys,
        hidden: tuple[int, ...],
        cnn_channels: tuple[int, int, int] = (32, 64, 64),
        cnn_out: int = 256,
        log_std_init: np.ndarray | None = None,
        value_init_std: np.ndarray | None = None,
    ):
        """`log_std_init`: each type's starting log std of its Gaussian head ([n_types]; None:
        0, CleanRL's). `value_init_std`: each type's orthogonal gain of its value output row
        ([n_types]; None: 1.0, CleanRL's). Only the start: both are trained, and a checkpoint
        or export loaded over them brings its own."""
        super().__init__()
        rgb = [k for k in obs_keys if k.name == "rgb"]
        self.rgb = RgbEncoder(rgb[0].shape, cnn_channels, cnn_out) if rgb else None
        low_dim = sum(int(np.prod(k.shape)) for k in obs_keys if k.name != "rgb")
        n_feat = low_dim + (self.rgb.out if self.rgb else 0)
        self.disc_n = plan.actions.discrete_n
        self.cont_dim = plan.actions.cont_dim
        n_types = len(plan.names)
        key_mask = np.zeros((n_types, len(obs_keys)), dtype=np.float32)
        disc_mask = np.zeros((n_types, max(self.disc_n, 1)), dtype=bool)
        cont_mask = np.zeros((n_types, max(self.cont_dim, 1)), dtype=np.float32)
        is_cont = np.zeros(n_types, dtype=bool)
        for t, spec in enumerate(plan.specs):
            for j, k in enumerate(obs_keys):
                key_mask[t, j] = k.name in spec.obs
            if spec.action_kind == CONTINUOUS:
                is_cont[t] = True
                cont_mask[t, : spec.action_n] = 1.0
            else:
                disc_mask[t, : spec.action_n] = True
        self.register_buffer("key_mask", torch.from_numpy(key_mask))
        self.register_buffer("disc_mask", torch.from_numpy(disc_mask))
        self.register_buffer("cont_mask", torch.from_numpy(cont_mask))
        self.register_buffer("is_cont", torch.from_numpy(is_cont))
        self.key_names = [k.name for k in obs_keys]
        # Masks that change nothing are skipped (the same numbers, fewer ops per forward): a
        # mix whose types all produce every key, and all use every discrete action.
        self.every_type_every_key = bool(key_mask.all())
        self.every_type_every_action = bool(disc_mask.all())
        widths = feature_widths(plan, obs_keys, self.rgb.out if self.rgb else 0)
        # the last key's columns no type reads: the board's padding after them (prepared_obs)
        self.last_key_unread = n_feat - max(widths) if obs_keys[-1].name != "rgb" else 0
        self.critic = Tower(n_types, n_feat, hidden, 1, out_std=1.0, in_widths=widths)
        if value_init_std is not None:
            # an orthogonal matrix at gain g is the one at gain 1 times g: scaling draws no
            # random numbers, so a run that sets no type's gain builds the same weights
            gain = torch.as_tensor(value_init_std, dtype=self.critic.out.weight.dtype)
            self.critic.out.weight.data.mul_(gain.reshape(n_types, 1, 1))
        self.popart = PopArt(n_types)
        self.actor_disc = (
            Tower(n_types, n_feat, hidden, self.disc_n, out_std=0.01, in_widths=widths) if self.disc_n else None
        )
        self.actor_cont = (
            Tower(n_types, n_feat, hidden, self.cont_dim, out_std=0.01, in_widths=widths) if self.cont_dim else None
        )
        log_std = torch.zeros(n_types, max(self.cont_dim, 1))
        if log_std_init is not None:
            log_std += torch.as_tensor(log_std_init, dtype=log_std.dtype).reshape(n_types, 1)
        self.log_std = nn.Parameter(log_std)

    # -- encoders ------------------------------------------------------------------------------
    def features(self, obs: dict[str, torch.Tensor], types: torch.Tensor) -> torch.Tensor:
        if self.every_type_every_key:  # no key to mask: the obs as they are, in the masks' dtype
            dtype = self.key_mask.dtype
            parts = [
                self._rgb_features(obs[name], None) if name == "rgb" else obs[name].to(dtype).reshape(len(types), -1)
                for name in self.key_names
            ]
            return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        # A key may come with one row per sample, or (a PPO batch, ppo.concat_blocks) with rows
        # for the samples whose type produces it only, in sample order: the same features.
        mask = self.key_mask[types]  # [B, n_keys]
        parts = []
        for j, name in enumerate(self.key_names):
            x = obs[name]
            if name == "rgb":
                parts.append(self._rgb_features(x, mask[:, j] > 0))
            elif len(x) == len(types):
                parts.append(x.float().reshape(len(types), -1) * mask[:, j : j + 1])
            else:  # the masked rows are the zeros the board holds there (x * 1 is x)
                width = math.prod(x.shape[1:])
                part = torch.zeros(len(types), width, device=x.device)
                part[_key_rows(mask[:, j] > 0, len(x), name)] = x.float().reshape(len(x), width)
                parts.append(part)
        return torch.cat(parts, dim=1)

    def _rgb_features(self, rgb: torch.Tensor, has_rgb: torch.Tensor | None) -> torch.Tensor:
        """The CNN runs only on rows whose env type renders rgb (has_rgb None: every row): in
        a mixed run most rows would feed it zeros, and the CNN is the policy's dominant cost.
        `rgb` holds a row per sample, or the rows of the samples with rgb only."""
        if has_rgb is None or bool(has_rgb.all()):
            return self.rgb(rgb)
        out = torch.zeros(len(has_rgb), self.rgb.out, device=has_rgb.device)
        rows = _key_rows(has_rgb, len(rgb), "rgb")
        if len(rows):
            out[rows] = self.rgb(rgb[rows] if len(rgb) == len(has_rgb) else rgb)
        return out

    # -- heads (all on type-sorted rows) -------------------------------------------------------
    def _value_normalized(self, feat: torch.Tensor, order: TypeOrder) -> torch.Tensor:
        return self.critic(feat, order).squeeze(-1)

    def _dists(self, feat: torch.Tensor, order: TypeOrder):
        """(each row's discrete logits, a type's invalid actions masked; its Gaussian), None for a
        head the mix has not. The categorical's log-prob, entropy and sampling come from the
        logits, one call each (rlpipe/learner/ppo_kernels.py); a torch Categorical is built only
        for the mode and `dist_params`. validate_args=False: the Gaussian's arguments are the
        towers' own outputs and the actions they sampled; torch's checks of them were a dozen
        small ops per call (a NaN in the logits still fails loudly, in sampling)."""
        types = order.types
        logits = cont = None
        if self.actor_disc is not None:
            logits = self.actor_disc(feat, order)
            if not self.every_type_every_action:
                logits = logits.masked_fill(~self.disc_mask[types], MASKED_LOGIT)
        if self.actor_cont is not None:
            mean = self.actor_cont(feat, order)
            cont = Normal(mean, self.log_std[types].exp(), validate_args=False)
        return logits, cont

    def _logp_entropy(self, logits, cont, types, a_disc, a_cont, entropy: bool = True):
        """(log-prob of the actions, entropy); the entropy is None where not asked for (acting)."""
        if logits is not None:
            d_lp, d_ent = categorical_logp_entropy(logits, a_disc, entropy)
        else:
            zeros = torch.zeros(len(types), device=types.device)
            d_lp, d_ent = zeros, zeros if entropy else None
        return self._with_cont(cont, types, a_cont, d_lp, d_ent, logits is not None, entropy)

    def _with_cont(self, cont, types, a_cont, d_lp, d_ent, has_disc: bool, entropy: bool):
        """The discrete head's log-prob and entropy, with the Gaussian's on continuous types."""
        if cont is None:
            return d_lp, d_ent
        valid = self.cont_mask[types]
        c_lp = (cont.log_prob(a_cont) * valid).sum(-1)
        c_ent = (cont.entropy() * valid).sum(-1) if entropy else None
        if not has_disc:
            return c_lp, c_ent
        sel = self.is_cont[types]
        return torch.where(sel, c_lp, d_lp), torch.where(sel, c_ent, d_ent) if entropy else None

    def _sorted(self, obs, types) -> tuple[torch.Tensor, TypeOrder]:
        order = TypeOrder.of(types)
        return order.sort(self.features(obs, types)), order

    def _sample(self, logits, cont, n: int, dev):
        """(discrete actions, continuous actions, the discrete head's log-prob of its actions and
        each row's log-normalizer (None without the head))."""
        if logits is not None:
            a_disc, d_lp, lse = categorical_sample(logits)
        else:
            a_disc, d_lp, lse = torch.zeros(n, dtype=torch.int64, device=dev), torch.zeros(n, device=dev), None
        a_cont = cont.sample() if cont is not None else torch.zeros(n, 1, device=dev)
        return a_disc, a_cont, d_lp, lse

    # -- public API (row order in, row order out) ----------------------------------------------
    @torch.no_grad()
    def value(self, obs, types) -> torch.Tensor:
        """V(obs) in return space (the PopArt statistics of each row's type applied)."""
        feat, order = self._sorted(obs, types)
        v = self.popart.denormalize(self._value_normalized(feat, order), order.types)
        return order.unsort(v)

    @torch.no_grad()
    def act(self, obs, types, deterministic: bool = False):
        """Actions for a batch: (discrete [B] int64, continuous [B, cont_dim], logp, value in
        return space). `deterministic`: the mode of each distribution instead of a sample."""
        feat, order = self._sorted(obs, types)
        logits, cont = self._dists(feat, order)
        if deterministic:
            a_disc = (
                Categorical(logits=logits, validate_args=False).probs.argmax(-1)
                if logits is not None
                else torch.zeros(len(types), dtype=torch.int64, device=feat.device)
            )
            a_cont = cont.mean if cont is not None else torch.zeros(len(types), 1, device=feat.device)
            logp, _ = self._logp_entropy(logits, cont, order.types, a_disc, a_cont, entropy=False)
        else:
            a_disc, a_cont, d_lp, _ = self._sample(logits, cont, len(types), feat.device)
            logp, _ = self._with_cont(cont, order.types, a_cont, d_lp, None, logits is not None, False)
        value = self.popart.denormalize(self._value_normalized(feat, order), order.types)
        return tuple(order.unsort(x) for x in (a_disc, a_cont, logp, value))

    @torch.no_grad()
    def act_explore(self, obs, types, generator: torch.Generator | None = None) -> ActOut:
        """`act` plus one uniform alternative per sample and the policy's log-prob of it: what
        a worker needs to apply epsilon-greedy and report the behaviour log-prob. The policy
        sample is drawn exactly as `act` draws it; the alternative uses `generator` (a
        dedicated one, so exploration does not shift the policy's random stream)."""
        feat, order = self._sorted(obs, types)
        logits, cont = self._dists(feat, order)
        st, b, dev = order.types, len(types), feat.device
        a_disc, a_cont, d_lp, lse = self._sample(logits, cont, b, dev)
        logp, _ = self._with_cont(cont, st, a_cont, d_lp, None, logits is not None, False)
        # The alternatives are drawn in row order, so a row's draw does not depend on the
        # batch's type layout.
        n_valid = self.disc_mask[types].sum(-1).clamp_min(1)
        alt_disc = torch.minimum((torch.rand(b, generator=generator, device=dev) * n_valid).long(), n_valid - 1)
        alt_cont = (torch.rand(a_cont.shape, generator=generator, device=dev) * 2.0 - 1.0) * self.cont_mask[types][
            :, : a_cont.shape[1]
        ]
        d_alt = log_prob_at(logits, order.sort(alt_disc), lse) if logits is not None else d_lp
        alt_logp, _ = self._with_cont(cont, st, order.sort(alt_cont), d_alt, None, logits is not None, False)
        value = self.popart.denormalize(self._value_normalized(feat, order), st)
        a_disc, a_cont, logp, value, alt_logp = (order.unsort(x) for x in (a_disc, a_cont, logp, value, alt_logp))
        return ActOut(a_disc, a_cont, logp, value, alt_disc, alt_cont, alt_logp)

    def prepared_obs(self, obs: dict[str, torch.Tensor]) -> dict:
        """`obs` as a PPO update hands its minibatches to `evaluate`: the rgb rows converted
        for the CNN once (ImageRows), not in every minibatch of every epoch; the last key
        without its columns that no type's input layer reads (CartPole's 4 state numbers on a
        32-wide board: the update's shuffles and first products then move the 4 alone, the
        same sums; docs/benchmarks.md, "The board's padding left out of the update")."""
        last = self.key_names[-1]
        if self.last_key_unread and last in obs:
            x = obs[last].flatten(1)  # a rank's empty batch too: [0, width]
            if x.shape[1] > self.last_key_unread:
                obs = {**obs, last: x[:, : x.shape[1] - self.last_key_unread].contiguous()}
        rgb = obs.get("rgb")
        if self.rgb is None or rgb is None:
            return obs
        return {**obs, "rgb": ImageRows(self.rgb.inputs(rgb), torch.arange(len(rgb), device=rgb.device))}

    def evaluate(self, obs, types, a_disc, a_cont):
        """(log-prob, entropy, *normalized* value) of the given actions, with gradients: what
        the PPO loss needs (value targets are normalized with the same statistics)."""
        feat, order = self._sorted(obs, types)
        logits, cont = self._dists(feat, order)
        logp, entropy = self._logp_entropy(logits, cont, order.types, order.sort(a_disc), order.sort(a_cont))
        value = self._value_normalized(feat, order)
        return order.unsort(logp), order.unsort(entropy), order.unsort(value)

    def dist_params(self, obs, types) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Masked discrete logits and continuous means in row order (tests, evaluation)."""
        feat, order = self._sorted(obs, types)
        logits, cont = self._dists(feat, order)
        return (
            order.unsort(Categorical(logits=logits, validate_args=False).logits) if logits is not None else None,
            order.unsort(cont.mean) if cont is not None else None,
        )
