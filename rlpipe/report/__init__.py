"""Reports rebuilt from run directories: `python -m rlpipe.report` (see __main__)."""
