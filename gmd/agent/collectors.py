"""Which collector reads this host: the collectors by kind (``agent.collector``), and what
``"auto"`` chooses, in one registry (node_exporter's way), so that a new collector is one entry
here and not another branch in the agent's wiring.

The replay collector is not in it: it simulates a host rather than reading one, and comes
with the clock that drives the agent (:func:`gmd.agent.replay_run.replay_from_config`).
"""

from __future__ import annotations

from collections.abc import Callable

from gmd import GmdError
from gmd.agent.collect.base import Collector
from gmd.agent.config import AgentConfig, CollectorKind


class CollectorUnavailable(GmdError):
    """The configured collector cannot run here (its library is missing); says what to do."""


def _libvirt(config: AgentConfig) -> Collector:
    from gmd.agent.collect.libvirt import LibvirtCollector

    return LibvirtCollector(
        config.libvirt_uri,
        default_customer=config.default_customer,
        describe_every_s=config.describe_every_s,
        backoff_max_s=config.reconnect_max_s,
        domains=config.domains,
    )


def _kernel(config: AgentConfig) -> Collector:
    from gmd.agent.collect.kernel import KernelCollector

    return KernelCollector(
        config.libvirt_uri,
        default_customer=config.default_customer,
        describe_every_s=config.describe_every_s,
        backoff_max_s=config.reconnect_max_s,
        domains=config.domains,
    )


HOST_COLLECTORS: dict[CollectorKind, Callable[[AgentConfig], Collector]] = {
    CollectorKind.kernel: _kernel,
    CollectorKind.libvirt: _libvirt,
}
"""The collectors that read a real host, by the kind that names them in gmd.toml."""


def choose(config: AgentConfig) -> tuple[CollectorKind, str]:
    """The host collector ``config`` asks for, ``"auto"`` decided (the kernel's files where
    :func:`~gmd.agent.collect.kernel.kernel_collector_fits`, else libvirt's bulk stats), and
    why, for the log."""
    if config.collector != CollectorKind.auto:
        return config.collector, f"agent.collector = {config.collector.value}"
    from gmd.agent.collect.kernel import kernel_collector_fits

    why_not = kernel_collector_fits(config.libvirt_uri)
    if why_not:
        return CollectorKind.libvirt, f"agent.collector = auto: libvirt's bulk stats ({why_not})"
    return CollectorKind.kernel, "agent.collector = auto: the kernel's counter files"


def host_collector(config: AgentConfig) -> tuple[Collector, str]:
    """The collector that reads this host, and why it was chosen; raises
    :class:`CollectorUnavailable` when the libvirt binding is missing."""
    try:
        import libvirt  # noqa: F401  (every host collector needs it)
    except ImportError as exc:
        raise CollectorUnavailable(
            f"the libvirt Python binding is missing ({exc}): pip install libvirt-python"
            " (it builds a C extension: apt-get install libvirt-dev python3-dev pkg-config gcc)"
        ) from None
    kind, why = choose(config)
    if kind not in HOST_COLLECTORS:
        raise CollectorUnavailable(f"agent.collector = {kind.value} does not read a host")
    return HOST_COLLECTORS[kind](config), why
