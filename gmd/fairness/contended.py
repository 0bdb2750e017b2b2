"""What customers took of contended hosts' capacity in one interval, as measured and as a
level's hard caps would have bounded it.

A what-if asks how much a change of settings "would have protected the others". Its answer to
first order: on the hosts that were contended (a host's use of a resource reached its
``contended_above`` fraction of the supply, in the interval itself), a capped customer's VM
would have used at most its cap (a fraction of its configured amount: vCPUs × the interval for
CPU); what it gave back is what the moderate customers' share of the used capacity gains. The
moderate customers' own unmet demand is not known (they used what they got), so the gain is a
bound from below, and a VM's use is never raised above what was measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gmd.fairness.interval import IntervalUse


@dataclass(frozen=True)
class ContendedUse:
    """Per customer account: its VMs' use of one resource on the hosts contended for it."""

    measured: np.ndarray
    """what was measured"""
    capped: np.ndarray
    """each VM's use bounded by its customer's cap (unbounded where the customer has none or
    the VM's configured amount is unknown)"""


def contended_use(
    use: IntervalUse, resource: int, threshold: float, cap_fraction: np.ndarray
) -> ContendedUse:
    """Per customer account (``cap_fraction`` holds one entry per account, NaN: uncapped), its
    VMs' use of ``resource`` (a column of ``use.use``) on the hosts whose use of it reached
    ``threshold`` × their supply in this interval (``threshold`` 0: every host)."""
    amount = np.nan_to_num(use.use[:, resource], nan=0.0)
    supply = use.supply[:, resource]
    host_used = np.bincount(use.host_of_vm, weights=amount, minlength=len(supply))
    contended = (supply > 0) & (host_used >= threshold * supply)
    measured = np.where(contended[use.host_of_vm], amount, 0.0)
    limit = cap_fraction[use.customer_of_vm] * use.configured[:, resource]
    capped = np.where(np.isnan(limit), measured, np.minimum(measured, limit))
    n = len(cap_fraction)
    return ContendedUse(
        measured=np.bincount(use.customer_of_vm, weights=measured, minlength=n),
        capped=np.bincount(use.customer_of_vm, weights=capped, minlength=n),
    )
