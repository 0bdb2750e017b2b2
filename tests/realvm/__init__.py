"""Tests on real QEMU guests under the real libvirtd (tests/support/realvm.py)."""
