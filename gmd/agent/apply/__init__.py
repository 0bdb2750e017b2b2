"""The agent's enforcement: the daemon's host plan applied to VMs through libvirt LIVE tuning or
cgroup files, with every VM's original settings kept on disk to put them back exactly."""
