"""Overrides that make `cadence train` small enough for an end-to-end test (seconds, not minutes)."""

QUICK_RUN = [
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "trainer.micro_batch_size=16",
    "eval.before=false",
    "eval.after=false",
    "eval.every=0",
    "logging.progress=false",
    "logging.tensorboard=false",
    "task.test_size=8",
]
