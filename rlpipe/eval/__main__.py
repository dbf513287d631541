"""`python -m rlpipe.eval <run_dir> [--episodes N] [--types a,b] [--video]`: see the trained
agent of a run and measure it.

Loads the run's newest weights, rebuilds every env type from the run's own config, plays N
episodes per type with the deterministic policy (the mode of each action distribution) and N
with the stochastic one, and writes `<run_dir>/eval/returns.json` and `returns.md` beside
each type's random-action return (the run's `random_returns.json`, else measured here).
`--video` films one deterministic episode per type that can be filmed
(`<run_dir>/eval/<type>.mp4`) and logs it, with the eval returns, to the run's TensorBoard.

Exit codes: 0 done, 2 when the run cannot be evaluated (one paragraph says why), 130 / 143
when SIGINT / SIGTERM stopped it (one line, rlpipe.interrupts; returns.json, returns.md and
each film take their names only once whole, so an earlier evaluation's stay as they were).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlpipe.config_checks import SEED_LIMIT
from rlpipe.eval.loader import EvalError
from rlpipe.eval.results import type_line
from rlpipe.interrupts import stops_at_once

EXIT_BAD_INPUT = 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m rlpipe.eval", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path, help="a run directory (outputs/<date>/<time> or one multirun job)")
    p.add_argument("--episodes", type=int, default=10, help="episodes per type and mode (default 10)")
    p.add_argument("--types", default=None, help="comma-separated env types (default: every type of the run)")
    p.add_argument("--video", action="store_true", help="film one deterministic episode per type")
    p.add_argument(
        "--max-steps",
        type=int,
        default=5_000,
        help="an episode still running after this many steps is cut (default 5000; an "
        "untrained Atari policy that never serves would play 27,000)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=10_000,
        help="env seeds are seed, seed+1, ...: apart from the training seeds by default",
    )
    args = p.parse_args(argv)
    if args.episodes < 1:
        raise EvalError(f"--episodes {args.episodes}: allowed is a positive number of episodes")
    if args.max_steps < 1:
        raise EvalError(f"--max-steps {args.max_steps}: allowed is a positive number of steps")
    if not 0 <= args.seed < SEED_LIMIT:  # run.seed's range: Gymnasium refuses a negative seed
        raise EvalError(f"--seed {args.seed}: allowed is an integer from 0 to {SEED_LIMIT - 1}")
    return args


def pick_types(names: tuple[str, ...], wanted: str | None) -> list[int]:
    if wanted is None:
        return list(range(len(names)))
    chosen = [w.strip() for w in wanted.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in names]
    if unknown or not chosen:
        raise EvalError(
            f"--types {wanted!r}: {', '.join(unknown) or 'no type'} is not a type of this "
            f"run; its types are {', '.join(names)}"
        )
    return [names.index(w) for w in dict.fromkeys(chosen)]


def random_baseline(run_dir: Path, name: str, node: dict, episodes: int, seed: int, budget_s: float) -> dict:
    from rlpipe.envs.random_return import play_random, read_results

    saved = read_results(run_dir).get(name)
    if saved and saved.get("mean") is not None:
        return {**saved, "source": "run"}
    return {**play_random(node, episodes, budget_s, seed), "source": "measured"}


def evaluate(args: argparse.Namespace, console: Console) -> dict:
    import torch

    from rlpipe.eval import loader

    t_start = time.monotonic()
    run = loader.load_run(args.run_dir)
    # Batches of a few rows: more intra-op threads only spin against each other (and against
    # whatever else the machine runs), as in the learner (learner.torch_threads).
    threads = torch.get_num_threads()
    torch.set_num_threads(run.spec.learner.torch_threads)
    try:
        return _evaluate(run, args, console, t_start)
    finally:
        torch.set_num_threads(threads)


def _evaluate(run, args: argparse.Namespace, console: Console, t_start: float) -> dict:
    from rlpipe.envs.registry import make_factory
    from rlpipe.eval import video
    from rlpipe.learner import play

    plan, spec = run.plan, run.spec
    chosen = pick_types(plan.names, args.types)
    out_dir = run.run_dir / "eval"
    nodes = {t.name: t.node for t in spec.env_types}
    result = {
        "run_dir": str(run.run_dir),
        "weights": str(run.source.relative_to(run.run_dir)),
        "env_steps": run.env_steps,
        "episodes": args.episodes,
        "seed": args.seed,
        "types": {},
    }
    films: dict[str, video.Recorder] = {}
    columns = (TextColumn("{task.description:<28}"), BarColumn(bar_width=24), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False, disable=not console.is_terminal) as bar:
        for t in chosen:
            name = plan.names[t]
            factory = make_factory(nodes[name])
            entry: dict = {}
            for mode, deterministic in (("deterministic", True), ("stochastic", False)):
                task = bar.add_task(f"{name} {mode}", total=args.episodes)
                eps = play.play(
                    run.policy,
                    plan,
                    t,
                    factory,
                    args.episodes,
                    deterministic,
                    args.seed,
                    args.max_steps,
                    spec.worker.step_timeout_s,
                    on_episode=lambda task=task: bar.advance(task),
                )
                entry[mode] = eps.stats()
            task = bar.add_task(f"{name} random", total=1)
            entry["random"] = random_baseline(
                run.run_dir, name, nodes[name], args.episodes, args.seed, spec.logging.random_return_budget_s
            )
            bar.advance(task)
            if args.video:
                task = bar.add_task(f"{name} video", total=1)
                entry.update(_film(run, t, nodes[name], args, out_dir, films))
                bar.advance(task)
            result["types"][name] = entry
            if not console.is_terminal:
                print(f"rlpipe.eval: {type_line(name, entry)}", flush=True)
    result["wall_s"] = round(time.monotonic() - t_start, 2)
    _tensorboard(run, result, films)
    return result


def _film(run, t: int, node: dict, args, out_dir: Path, films: dict) -> dict:
    from rlpipe.eval import video
    from rlpipe.learner import play

    name = run.plan.names[t]
    factory, grab = video.render_source(node, run.plan.specs[t])
    if factory is None:
        return {"video": None, "video_note": grab}
    rec = video.Recorder(grab, out_dir / f"{name}.mp4")
    try:
        eps = play.play(
            run.policy,
            run.plan,
            t,
            factory,
            1,
            True,
            args.seed,
            args.max_steps,
            run.spec.worker.step_timeout_s,
            observe=rec.observe,
        )
    except Exception:  # no half film left (a stop signal removes it itself: rlpipe.interrupts)
        rec.discard()
        raise
    path = rec.close()
    if path is None:
        return {"video": None, "video_note": rec.error or "the filmed episode was cut before its first frame"}
    films[name] = rec
    note = {"video_frames": rec.frames, "video_return": eps.returns[0] if eps.returns else None}
    if rec.error:
        note["video_note"] = rec.error
    return {"video": str(path.relative_to(run.run_dir)), **note}


def _tensorboard(run, result: dict, films: dict) -> None:
    """Eval returns as scalars and the films as GIFs, at the weights' env step, in the run's tb/."""
    from torch.utils.tensorboard import SummaryWriter

    from rlpipe.eval.video import log_gif

    writer = SummaryWriter(str(run.run_dir / "tb"))
    try:
        for name, entry in result["types"].items():
            for mode in ("deterministic", "stochastic"):
                if entry[mode]["mean"] is not None:
                    writer.add_scalar(f"eval/return_{mode}/{name}", entry[mode]["mean"], run.env_steps)
            if name in films:
                rec = films[name]
                log_gif(writer, f"eval/video/{name}", rec.kept, rec.fps / rec.stride, run.env_steps)
    finally:
        writer.close()


def main(argv: list[str] | None = None) -> int:
    console = Console(stderr=True)
    try:
        args = parse_args(argv)
        with stops_at_once(
            "rlpipe.eval", args.run_dir / "eval", "the run's eval/ keeps what an earlier evaluation wrote"
        ):
            result = evaluate(args, console)
            from rlpipe.eval import results

            _json, md = results.write(Path(result["run_dir"]) / "eval", result)
    except EvalError as exc:
        print(f"rlpipe.eval: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    out = Console()
    if out.is_terminal:  # a table a person can read at any width
        from rich.markdown import Markdown

        out.print(Markdown(md.read_text()))
    else:
        print(md.read_text(), end="")
    print(f"rlpipe.eval: wrote {md} and returns.json in {result['wall_s']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
