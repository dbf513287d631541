"""bullet_reacher's forkserver preload (`BulletReacher.preload`): pybullet imported once for
every worker the forkserver forks, through `import_pybullet`, so its "pybullet build time"
banner does not reach the terminal. Named as a plain `pybullet` preload, the forkserver's own
import printed it there, among the first lines of `+stage=day4`."""

from rlpipe.envs.bullet import import_pybullet

import_pybullet()
