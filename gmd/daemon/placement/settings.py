"""``[placement]`` of gmd.toml: whether Placement vouches for what hosts claim (see
:mod:`gmd.daemon.placement`), each key declared once (:mod:`gmd.common.settings`). Its cloud
defaults to the quotas' (:func:`gmd.daemon.config.parse` applies that rule)."""

from __future__ import annotations

from dataclasses import dataclass

from gmd.common.options import Choice, FreeTable, Number, Text
from gmd.common.settings import setting, table
from gmd.common.units import DAY_S, WEEK_S

PLACEMENT_VERIFY = ("auto", "on", "off")


@table("placement")
@dataclass(frozen=True)
class PlacementConfig:
    """Whether Placement vouches for what hosts claim (see :mod:`gmd.daemon.placement`)."""

    verify: str = setting(
        Choice(
            "auto",
            "``on``: every batch is checked against Placement before it is stored (a VM"
            " Placement contradicts is set aside, its samples quarantined; Placement"
            " unreachable: stored unverified, verified later); ``auto``: on wherever a cloud is"
            " configured (``cloud`` here or ``[enforcement.quota] cloud``), off in clouds"
            " without OpenStack; ``off``: hosts' tokens are trusted (a warning at every start"
            " where a cloud is configured)",
            PLACEMENT_VERIFY,
        )
    )
    cloud: str = setting(
        Text(
            "",
            "the clouds.yaml entry (an account that may read resource providers and"
            " allocations); empty: ``[enforcement.quota] cloud``'s",
        )
    )
    """the clouds.yaml entry Placement is read with: this table's, else the quotas'"""
    refresh_s: float = setting(
        Number(300.0, "how old a host's snapshot may grow before it is read again", 1, DAY_S)
    )
    timeout_s: float = setting(
        Number(
            5.0,
            "each request's timeout; never retried: a batch that cannot be verified is verified"
            " later",
            0.1,
            600,
        )
    )
    miss_s: float = setting(
        Number(
            30.0,
            "at most one read per host this often for a VM or capacity its snapshot does not"
            " vouch for",
            0,
            DAY_S,
        )
    )
    wait_s: float = setting(
        Number(
            900.0,
            "how long accounting waits, past an interval's grace, for its batches stored"
            " unverified",
            0,
            WEEK_S,
        )
    )
    providers: dict[str, str] = setting(
        FreeTable(
            {},
            "a table host = its resource provider's name, where that is not the host's own"
            " name (Nova's)",
            shown="none: each host's own name",
        )
    )

    @property
    def on(self) -> bool:
        """Whether batches are checked: ``on``, or ``auto`` where a cloud is configured."""
        return self.verify == "on" or (self.verify == "auto" and bool(self.cloud))

    @property
    def trusting_a_cloud(self) -> bool:
        """Turned off explicitly although a cloud is configured: said at every start."""
        return self.verify == "off" and bool(self.cloud)

    def provider_name(self, host: str) -> str:
        """The name of the host's resource provider in Placement."""
        return self.providers.get(host, host)
