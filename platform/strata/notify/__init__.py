"""Notifications: a team's webhooks and e-mail subscriptions, told about its jobs' ends, its quota and lost nodes
(docs/architecture.md, Notifications)."""
