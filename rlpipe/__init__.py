"""rlpipe: a single-machine RL training stack for thousands of heterogeneous environments."""

__version__ = "0.1.0"
