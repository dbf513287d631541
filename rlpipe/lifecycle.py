"""`python -m rlpipe.lifecycle <run_dir> [--env N]`: read a run's lifecycle.sqlite.

Counts by event kind and env type, or the ordered history of one env. The logic lives in
`rlpipe.supervisor.lifecycle`; this module is only the short command name.
"""
from rlpipe.supervisor.lifecycle import cli

if __name__ == "__main__":
    raise SystemExit(cli())
