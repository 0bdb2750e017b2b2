"""The pure core: the Greediness Metric, its baselines, and DirectContr bookkeeping.

numpy only; no I/O, no database, no clock — every input is an argument. Everything else in gmd
calls in here; nothing in here imports the rest of gmd.
"""

from gmd.fairness.baselines import (
    dominant_share,
    drf_key,
    price,
    price_cap_scarcity,
    price_scarcity,
)
from gmd.fairness.cloud import CloudGreediness, CloudInterval, cloud_greediness, flavor_endowment
from gmd.fairness.decay import DEFAULT_HALF_LIFE_S, decay_factor, decayed_balance
from gmd.fairness.directcontr import (
    UTILITIES,
    DirectContrBalances,
    directcontr_update,
    normalized_work,
)
from gmd.fairness.drf import equalizing_tasks, progressive_filling
from gmd.fairness.greediness import PoolGreediness, greediness, greediness_detail
from gmd.fairness.ranking import ranks, spread

__all__ = [
    "DEFAULT_HALF_LIFE_S",
    "UTILITIES",
    "CloudGreediness",
    "CloudInterval",
    "DirectContrBalances",
    "PoolGreediness",
    "cloud_greediness",
    "decay_factor",
    "decayed_balance",
    "directcontr_update",
    "dominant_share",
    "drf_key",
    "equalizing_tasks",
    "flavor_endowment",
    "greediness",
    "greediness_detail",
    "normalized_work",
    "price",
    "price_cap_scarcity",
    "price_scarcity",
    "progressive_filling",
    "ranks",
    "spread",
]
