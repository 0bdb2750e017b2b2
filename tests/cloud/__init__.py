"""Tests against the real OpenStack (tests/support/openstack_support.py, nova_support.py)."""
