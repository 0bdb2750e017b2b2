"""The Greediness Metric for a whole cloud interval: every host at once, no loop over hosts.

``fairness-model.md`` Sec. 2-3: each host is its own pool (VMs can only take from the host
they run on), endowments are ``equal`` or by ``flavor``, and every term is normalized by one
customer's share of the *cloud's* supply ``s_i = S_i / N`` so that greediness earned on a big
host and on a small one add up to a comparable customer total ``G_c``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from gmd.fairness._validate import (
    Labels,
    as_float_array,
    as_index_array,
    check_amounts,
    check_gamma,
    check_shape,
    resource_weights,
)
from gmd.fairness.greediness import normalized_terms, pool_offsets, resource_sum
from gmd.fairness.segments import segment_count, segment_sum


class EndowmentMode(StrEnum):
    """What each VM is endowed with on its host (``accounting.endowment``)."""

    equal = "equal"
    """each consumer on a host the same share"""
    flavor = "flavor"
    """what each VM was configured with, scaled down on overcommitted hosts"""


class ConsumerMode(StrEnum):
    """Who consumes on a host (``accounting.consumer``)."""

    vm = "vm"
    """each VM"""
    customer = "customer"
    """a customer's VMs on a host, together"""


ENDOWMENT_MODES: tuple[EndowmentMode, ...] = tuple(EndowmentMode)
CONSUMER_MODES: tuple[ConsumerMode, ...] = tuple(ConsumerMode)


@dataclass(frozen=True)
class CloudInterval:
    """What the ledger knows about one accounting interval, as arrays.

    ``use`` (VMs × m) is what each VM consumed in the interval; ``supply`` (hosts × m) is
    ``capacity × interval`` of each host; ``host_of_vm``/``customer_of_vm`` index into hosts and
    customers. ``configured`` (VMs × m) is each VM's flavor (vCPU-seconds, RAM byte-seconds, QoS
    limits) for ``flavor`` endowments, NaN where the flavor sets no amount (then the VM gets an
    equal split of that resource). Names are optional and only make error messages precise.
    """

    use: object
    supply: object
    host_of_vm: object
    customer_of_vm: object
    n_customers: int | None = None
    configured: object | None = None
    resources: Sequence[str] | None = None
    hosts: Sequence[str] | None = None
    vms: Sequence[str] | None = None


@dataclass(frozen=True)
class CloudGreediness:
    """The engine's answer for one interval.

    Consumers are VMs (``consumer="vm"``) or one (host, customer) pair each
    (``consumer="customer"``); ``consumer_of_vm`` maps VMs to them. Per-host arrays α, β, κ
    are (hosts × m). ``customer_greediness`` is ``G_c``, the sum over the customer's consumers,
    and ``customer_terms`` its per-resource breakdown. Per-consumer (n × m) arrays may be
    column-major (the engine computes one resource at a time); their values do not depend on it.
    """

    consumer_mode: ConsumerMode
    consumer_of_vm: np.ndarray
    consumer_host: np.ndarray
    consumer_customer: np.ndarray
    use: np.ndarray
    endowment: np.ndarray
    offsets: np.ndarray
    terms: np.ndarray
    greediness: np.ndarray
    over: np.ndarray
    ceded: np.ndarray
    credit: np.ndarray
    share: np.ndarray
    active_customers: int
    customer_greediness: np.ndarray
    customer_terms: np.ndarray

    @property
    def vm_greediness(self) -> np.ndarray:
        """``g_j`` per VM; only defined when VMs are the consumers."""
        if self.consumer_mode != ConsumerMode.vm:
            raise ValueError("per-VM greediness exists only with consumer='vm'")
        return self.greediness


@dataclass(frozen=True)
class _Checked:
    use: np.ndarray
    supply: np.ndarray
    host_of: np.ndarray
    customer_of: np.ndarray
    n_customers: int
    configured: np.ndarray | None
    cols: Labels


def _check(interval: CloudInterval, need_configured: bool) -> _Checked:
    use = as_float_array("use", interval.use, 2)
    n, m = use.shape
    if m == 0:
        raise ValueError("use must have at least one resource column")
    cols = Labels("resource", interval.resources, m)
    vms = Labels("VM", interval.vms, n)
    supply = as_float_array("supply", interval.supply, 2)
    if supply.shape[1:] != (m,):
        raise ValueError(f"supply must be hosts × {m} resources, got shape {supply.shape}")
    n_hosts = supply.shape[0]
    hosts = Labels("host", interval.hosts, n_hosts)
    check_amounts("supply", supply, hosts, cols, positive=True)
    check_amounts("use", use, vms, cols)
    host_of = as_index_array("host_of_vm", interval.host_of_vm, n, n_hosts, "host")
    customer_of_raw = np.asarray(interval.customer_of_vm)
    if interval.n_customers is None:
        n_customers = int(customer_of_raw.max()) + 1 if customer_of_raw.size else 0
    else:
        n_customers = int(interval.n_customers)
    customer_of = as_index_array(
        "customer_of_vm", customer_of_raw, n, max(n_customers, 0), "customer"
    )
    configured = None
    if need_configured:
        if interval.configured is None:
            raise ValueError("endowment='flavor' needs the VMs' configured amounts (configured)")
        configured = as_float_array("configured", interval.configured, 2)
        check_shape("configured", configured, (n, m), "VMs × resources, as use")
        check_amounts("configured", configured, vms, cols, allow_nan=True)
    return _Checked(use, supply, host_of, customer_of, n_customers, configured, cols)


def flavor_endowment(configured: np.ndarray, supply: np.ndarray, host_of: np.ndarray) -> np.ndarray:
    """``e_ij = v_ij · min(1, r_i / Σ_k v_ik)`` per host; NaN ``v_ij`` means an equal split.

    Scaling down on an overcommitted host keeps endowments within what the host can give, so
    that a VM on a host sold twice over is not called greedy for using half its flavor.

    One resource at a time, into a column-major array, as :func:`pool_offsets` and for the same
    reason. A resource no flavor sets (disk, network) is the equal split without a selection.
    """
    n_hosts = supply.shape[0]
    e = np.empty(configured.shape, order="F")
    unset = np.isnan(configured)
    per_host = None
    for i in range(configured.shape[1]):
        v = configured[:, i]
        if unset[:, i].any():
            if per_host is None:
                per_host = np.maximum(segment_count(host_of, n_hosts), 1)
            # ``take``, not ``[host_of]``: the same gather, several times faster.
            equal_split = (supply[:, i] / per_host).take(host_of)
            v = equal_split if unset[:, i].all() else np.where(unset[:, i], equal_split, v)
        total = segment_sum(v, host_of, n_hosts)
        # Divide only where the host is oversold: elsewhere a tiny total would overflow for nothing.
        scale = np.divide(supply[:, i], total, out=np.ones_like(total), where=total > supply[:, i])
        np.multiply(v, scale.take(host_of), out=e[:, i])
    return e


def cloud_greediness(
    interval: CloudInterval,
    *,
    gamma: float = 0.5,
    endowment: EndowmentMode | object = EndowmentMode.flavor,
    consumer: ConsumerMode = ConsumerMode.vm,
    weights: object | None = None,
    share: object | None = None,
) -> CloudGreediness:
    """Greediness of every consumer on every host of one interval, and each customer's sum.

    ``endowment`` is a mode (``"equal"``, ``"flavor"``) or the VMs' endowments themselves
    (VMs × m), e.g. as recorded in the ledger when an interval is re-accounted.
    ``share`` overrides the cloud-wide per-customer share ``s_i`` (default: the cloud's total
    supply divided by the number of customers with a VM in the interval).
    """
    mode = endowment if isinstance(endowment, str) else "given"
    if mode not in (*ENDOWMENT_MODES, "given"):
        raise ValueError(
            f"endowment = {endowment!r}; choose one of {', '.join(ENDOWMENT_MODES)} "
            "or give the VMs' endowments as an array"
        )
    if consumer not in CONSUMER_MODES:
        raise ValueError(f"consumer = {consumer!r}; choose one of {', '.join(CONSUMER_MODES)}")
    consumer = ConsumerMode(consumer)
    c = _check(interval, mode == EndowmentMode.flavor)
    g = check_gamma(gamma)
    m = c.use.shape[1]
    n_hosts = c.supply.shape[0]
    w = resource_weights(weights, m, c.cols)

    active = int(np.count_nonzero(segment_count(c.customer_of, c.n_customers)))
    if share is None:
        s = c.supply.sum(axis=0) / max(active, 1)
    else:
        s = as_float_array("share", share, 1)
        check_shape("share", s, (m,), "one amount per resource")
        check_amounts("share", s, None, c.cols, positive=True)

    consumer_of, consumer_host, consumer_customer, use = _consumers(c, consumer)
    if mode == EndowmentMode.equal:
        per_host = segment_count(consumer_host, n_hosts)
        e = (c.supply / np.maximum(per_host, 1)[:, None]).take(consumer_host, axis=0)
    else:
        vm_e = _vm_endowments(interval, c, mode, endowment)
        e = vm_e if consumer == ConsumerMode.vm else segment_sum(vm_e, consumer_of, use.shape[0])

    off = pool_offsets(use, e, consumer_host, n_hosts, g)
    terms = normalized_terms(off.offsets, s, w)
    gm = resource_sum(terms)
    return CloudGreediness(
        consumer_mode=consumer,
        consumer_of_vm=consumer_of,
        consumer_host=consumer_host,
        consumer_customer=consumer_customer,
        use=use,
        endowment=e,
        offsets=off.offsets,
        terms=terms,
        greediness=gm,
        over=off.over,
        ceded=off.ceded,
        credit=off.credit,
        share=s,
        active_customers=active,
        customer_greediness=segment_sum(gm, consumer_customer, c.n_customers),
        customer_terms=segment_sum(terms, consumer_customer, c.n_customers),
    )


def _consumers(
    c: _Checked, consumer: ConsumerMode
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Who is judged (:class:`ConsumerMode`): each VM's consumer, each consumer's host and
    customer, and each consumer's use (a customer's VMs on a host summed)."""
    if consumer == ConsumerMode.vm:
        return np.arange(c.use.shape[0], dtype=np.intp), c.host_of, c.customer_of, c.use
    stride = max(c.n_customers, 1)
    key = c.host_of.astype(np.int64) * stride + c.customer_of
    uniq, consumer_of = np.unique(key, return_inverse=True)
    consumer_of = consumer_of.astype(np.intp).ravel()
    return (
        consumer_of,
        (uniq // stride).astype(np.intp),
        (uniq % stride).astype(np.intp),
        segment_sum(c.use, consumer_of, uniq.size),
    )


def _vm_endowments(
    interval: CloudInterval, c: _Checked, mode: str, endowment: object
) -> np.ndarray:
    """Each VM's endowment: its flavor's share of its host (``flavor``), or as given (VMs ×
    resources, checked)."""
    n, m = c.use.shape
    if mode == EndowmentMode.flavor:
        assert c.configured is not None  # _check asked for it
        return flavor_endowment(c.configured, c.supply, c.host_of)
    vm_e = as_float_array("endowment", endowment, 2)
    check_shape("endowment", vm_e, (n, m), "VMs × resources, as use")
    check_amounts("endowment", vm_e, Labels("VM", interval.vms, n), c.cols)
    return vm_e
