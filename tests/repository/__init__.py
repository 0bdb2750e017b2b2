"""Checks of the whole repository: the packages' layout, the docs, self-containment."""
