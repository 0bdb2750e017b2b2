"""gmd, the Greediness Metric daemon: fairness accounting and enforcement for clouds.

The data path is the package layout: ``collect`` → ``ingest`` → ``ledger`` (account) →
``enforce`` → ``report``, all calling the pure math in ``gmd.fairness``.
"""

__version__ = "0.1.0"


class GmdError(Exception):
    """The root of every error gmd raises on purpose: something it was given or found cannot
    be used, said in one line that names what and where. Each edge has its own subclass
    (a configuration key, a batch, a trace, a quota write, …), most also subclassing the
    built-in error they always were; a command line turns one into its error line and exit
    code, and anything else that escapes is a bug and shows as one. It lives here, in the
    package's own ``__init__``, so that every part of gmd may import it, even those that
    import nothing else of gmd (``gmd.fairness``, ``gmd.traces``, ``gmd.common``)."""


class OptionError(GmdError, ValueError):
    """What was asked cannot be answered as asked: an option, a range or a key the caller
    must fix (a command line's exit 2, the read API's 400)."""
