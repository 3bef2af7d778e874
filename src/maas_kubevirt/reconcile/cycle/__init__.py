"""The cycle: observe MAAS (the event log, the machines it names, their power parameters), plan,
apply; what a restart must keep comes back from the audit log.

One module per stage of the ``Reconciler``: ``driver`` (the Reconciler and each cycle's steps),
``observe`` (which machines a cycle reads: event-driven or a full resync, power checks), ``read``
(machines and their power parameters, judged), ``planning`` (the plan of what was read, re-read
before a change), ``generations`` (the cluster's credential generations), ``rotation`` (exposed
credentials rotated), ``switches`` (power-type switches), ``duplicates`` (duplicate claims and
suspects reported). Each stage is a mixin of the Reconciler, whose ``__init__`` (in ``driver``)
sets the state they all share.
"""

from maas_kubevirt.reconcile.cycle.driver import Cycle, Reconciler
from maas_kubevirt.reconcile.cycle.generations import ROTATION_SETTLE, lowered_fix, lowered_generations
from maas_kubevirt.reconcile.cycle.rotation import ROTATE, Exposure, rotate_command
from maas_kubevirt.reconcile.cycle.switches import Switched

__all__ = [
    "Cycle",
    "Exposure",
    "ROTATE",
    "ROTATION_SETTLE",
    "Reconciler",
    "Switched",
    "lowered_fix",
    "lowered_generations",
    "rotate_command",
]
