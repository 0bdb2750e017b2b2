"""The daemon's enforcement: levels decided after each interval, host plans, OpenStack quotas
and the audit log of every action."""
