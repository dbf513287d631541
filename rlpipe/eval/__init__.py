"""Evaluation of a trained run: `python -m rlpipe.eval <run_dir>` (see __main__).

- loader: the run's config, env plan and policy, rebuilt from its own files;
- play: whole episodes under the policy, obs laid out as on the board;
- video: frames, the MP4 and the TensorBoard GIF;
- results: eval/returns.json and eval/returns.md;
- during: one round of evaluation during training (`eval.interval_s`), started by the driver
  as `python -m rlpipe.eval.during`: a line of eval/history.jsonl.
"""
