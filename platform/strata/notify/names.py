"""The notifications a target may subscribe to (light: no Django, the CLI's parser reads it before setup)."""

# A job's end, its preemption, the team's quota holding jobs back, a lost node that ran the team's jobs.
EVENTS = ("job.succeeded", "job.failed", "job.preempted", "quota.reached", "node.lost")
# What the test button sends, to one target, whatever it subscribes to.
TEST_EVENT = "webhook.test"
