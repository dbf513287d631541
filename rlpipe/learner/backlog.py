"""How many batches of finished rollouts `learner.backlog` lets wait for an update. Read by the
learner, which drops beyond them (rlpipe/learner/training.py `backlogged`), and by the memory
check before the start, which counts them (rlpipe/learner/budget.py); kept apart so that the
check does not import the training side (torch)."""

# Batches that learner.backlog=drop keeps waiting while an update trains. One (a batch and
# less than a block) dropped 8-10 % of day4's env steps, rollouts that arrived in bursts while
# an update ran; two drop 1-2 % and trained 1.03-1.15x the samples a second, at one more
# update of policy lag on the older batch. A 30-minute day4 run learned the same eight types
# with it (docs/benchmarks.md, "Two batches kept under drop"; docs/multitask.md, "With two
# batches kept under drop").
DROP_KEEPS_BATCHES = 2


def waiting_batches(backlog: str) -> int:
    """Batches of finished blocks that can wait for an update, rounded up: under drop the
    DROP_KEEPS_BATCHES it keeps and less than a block beyond them; under hold or sync the next
    update's batch and the completions of the round that filled it."""
    return DROP_KEEPS_BATCHES + 1 if backlog == "drop" else 2
