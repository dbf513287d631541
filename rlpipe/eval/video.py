"""One episode per env type as a video: where its frames come from, the MP4, the TensorBoard GIF.

Frames:
- a Gymnasium type (`GymnasiumEnv`) is built once more with `render_mode="rgb_array"` in its
  make_kwargs and each frame is `env.render()`: the env's own picture (CartPole's cart and
  pole), not the downscaled obs the policy sees;
- any other type that produces an `rgb` obs (the emulators draw one: unity_sim, faulty with
  an rgb board, bullet_reacher with render_rgb) is filmed through that obs;
- a type with neither cannot be filmed and is said so.

The MP4 (H.264 through imageio's ffmpeg) is what a person opens. Small frames (the emulators'
64x64) are enlarged by an integer factor so a player does not blur them, and padded to even
sizes (yuv420p needs them). TensorBoard gets an animated GIF as an image summary (what
SummaryWriter.add_video writes, without its moviepy dependency), shrunk to stay light.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rlpipe.envs.classic import GymnasiumEnv
from rlpipe.envs.contract import EnvSpec
from rlpipe.envs.registry import make_factory
from rlpipe.files import partial_name

MIN_SIDE = 256  # smaller frames are enlarged to at least this (integer factor)
DEFAULT_FPS = 30
TB_MAX_FRAMES = 150
TB_MAX_WIDTH = 320


class Recorder:
    """Films one episode: `observe(env, obs)` is play()'s hook. Frames go to the MP4 as they
    come (an Atari episode is thousands of frames: none is held), and every `stride`-th is
    kept for the TensorBoard GIF, the stride doubling whenever more than TB_MAX_FRAMES are kept.
    The MP4 is written beside `path` (`<name>.partial-<pid>.mp4`) and takes its name once whole
    (`close`): a stopped evaluation leaves an earlier evaluation's film as it was."""

    def __init__(self, grab: Callable[[object, dict], np.ndarray], path: Path):
        self.grab = grab
        self.path = path
        self.partial = partial_name(path)
        self.frames = 0
        self.kept: list[np.ndarray] = []
        self.stride = 1
        self.fps = DEFAULT_FPS
        self.error: str | None = None
        self._writer = None

    def observe(self, env, obs: dict) -> None:
        if self.error is not None:
            return
        try:
            frame = self.grab(env, obs)
        except Exception as exc:  # a render that fails ends the film, not the evaluation
            self.error = f"render failed: {type(exc).__name__}: {exc}"
            return
        if frame is None:
            self.error = "render returned no frame"
            return
        frame = as_rgb(frame)
        if self._writer is None:
            meta = getattr(getattr(env, "env", None), "metadata", None) or {}
            self.fps = int(meta.get("render_fps") or DEFAULT_FPS)
            self._writer = mp4_writer(self.partial, self.fps)
        self._writer.append_data(for_player(frame))
        if self.frames % self.stride == 0:
            self.kept.append(frame)
            if len(self.kept) > TB_MAX_FRAMES:
                self.kept = self.kept[::2]
                self.stride *= 2
        self.frames += 1

    def close(self) -> Path | None:
        """Finish the MP4 under its name; its path, or None when no frame was filmed."""
        if self._writer is None:
            return None
        self._writer.close()
        self._writer = None
        os.replace(self.partial, self.path)
        return self.path

    def discard(self) -> None:
        """The film failed half-way: its partial MP4 removed."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self.partial.unlink(missing_ok=True)


def render_source(node: dict, spec: EnvSpec):
    """(factory, grab) to film one type, or (None, why not)."""
    factory = make_factory(node)
    if isinstance(factory.func, type) and issubclass(factory.func, GymnasiumEnv):
        # rgb_array never opens a window; without a display SDL (pygame) would print an
        # XDG_RUNTIME_DIR error while probing for one.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        kwargs = {**(node.get("make_kwargs") or {}), "render_mode": "rgb_array"}
        return make_factory({**node, "make_kwargs": kwargs}), lambda env, _obs: env.env.render()
    if "rgb" in spec.obs:
        return factory, lambda _env, obs: obs["rgb"]
    return None, "no rgb obs and not a Gymnasium env: nothing to film"


def as_rgb(frame: np.ndarray) -> np.ndarray:
    """Any HxW, HxWx1, HxWx3 or HxWx4 frame as uint8 HxWx3."""
    f = np.asarray(frame)
    if f.dtype != np.uint8:
        f = np.clip(f, 0, 255).astype(np.uint8)
    if f.ndim == 2:
        f = f[:, :, None]
    if f.shape[2] == 1:
        f = np.repeat(f, 3, axis=2)
    return np.ascontiguousarray(f[:, :, :3])


def for_player(frame: np.ndarray) -> np.ndarray:
    """Enlarged (nearest, integer factor) up to MIN_SIDE, then padded to even sides."""
    h, w, _ = frame.shape
    k = max(1, MIN_SIDE // max(h, w))
    if k > 1:
        frame = frame.repeat(k, axis=0).repeat(k, axis=1)
    h, w, _ = frame.shape
    if h % 2 or w % 2:
        frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
    return frame


def mp4_writer(path: Path, fps: int):
    """An H.264 MP4 writer (imageio's ffmpeg); append frames that went through for_player."""
    import imageio.v2 as imageio

    path.parent.mkdir(parents=True, exist_ok=True)
    return imageio.get_writer(
        path, format="FFMPEG", mode="I", fps=fps, codec="libx264", macro_block_size=2, ffmpeg_log_level="error"
    )


def gif_bytes(frames: list[np.ndarray], fps: float) -> tuple[bytes, int, int]:
    """(GIF, height, width) of the frames, at most TB_MAX_WIDTH wide, played at `fps`."""
    from PIL import Image

    shrink = max(1, -(-frames[0].shape[1] // TB_MAX_WIDTH))
    images = [Image.fromarray(np.ascontiguousarray(f[::shrink, ::shrink])) for f in frames]
    buf = io.BytesIO()
    images[0].save(
        buf, format="GIF", save_all=True, append_images=images[1:], duration=max(20, int(1000 / fps)), loop=0
    )
    h, w = images[0].height, images[0].width
    return buf.getvalue(), h, w


def log_gif(writer, tag: str, frames: list[np.ndarray], fps: float, step: int) -> None:
    """An animated GIF image summary (TensorBoard's images tab plays it)."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    data, h, w = gif_bytes(frames, fps)
    image = Summary.Image(height=h, width=w, colorspace=3, encoded_image_string=data)
    writer._get_file_writer().add_summary(Summary(value=[Summary.Value(tag=tag, image=image)]), step)
