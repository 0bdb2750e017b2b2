"""Enforcement: plans for hosts, appliers, OpenStack quotas, audit."""
