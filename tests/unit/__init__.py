"""Unit tests, one folder per package of gmd/: a module's tests are where the module is."""
