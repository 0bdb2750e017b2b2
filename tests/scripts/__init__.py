"""The tests' set-up: PostgreSQL, libvirtd, the OpenStack clouds, the development venv."""
