"""The reconciler: MAAS machines whose Redfish power address is exactly the bare host
``<vm>.<namespace>.<domain>`` get their BMC password (derived from the seed), are renamed
``<vm>-<namespace>``, filed in the pool ``<namespace>`` and, in New and with the password in
place, commissioned.

- ``plan(machines, power, pools, settings, taken, waiting)`` is pure: it returns the actions.
  ``power`` holds per machine only its address and whether its password is right (``Power``),
  never a password; ``taken``: hostnames other nodes hold, devices and controllers included;
  ``waiting``: machines whose commission backs off.
- Fail closed: the password goes only to the sole claimant of an identity whose address is
  canonical, in the same PUT that writes that address. A look-alike address (a suspect), a
  duplicate claim, or an address changed after the password was set: a derived password found
  there is put back to the placeholder (``reset-password``).
- ``apply(client, actions, audit, stop, passwords, backoff)`` carries them out; a machine's
  password, rename and pool move are one ``PUT machines/{id}/`` (one at a time when MAAS refuses
  the whole with a 400); each change is one JSON audit record; a commission MAAS refuses, or
  takes and then reverts to New before the machine passes Commissioning, backs that machine off
  (``Backoff``).
- ``Reconciler`` runs cycles. A cycle asks MAAS's event log what happened since the last one
  (``events.py``: two small requests when nothing did) and reads only the machines named there,
  ours in Commissioning or Testing and those whose backoff ended (``GET machines/?id=``), with
  their power parameters in one bulk request; a full resync (one ``GET machines/``, every
  machine's power parameters, of every type, so that a derived credential is found by its value
  without an audit record: ``owners``) runs at start, every ``maas.resync_interval`` and when the log
  cannot be trusted, and every ``maas.power_check_interval`` one bulk read of our machines' power
  parameters catches an address edited without an event. The pools are read only when a machine
  may need moving, ``nodes/?hostname=`` only when a rename may happen; then, only when
  something is to change, one bulk re-read of the addresses of the machines about to change. An
  idle cycle costs 2 small requests. A malformed machine record is skipped with one warning; the
  whole cycle runs within ``maas.cycle_deadline``.
- Two or more machines claiming one ``<vm>.<namespace>``: none of them gets anything, and one
  audit record names them all each time that set changes; a suspect likewise, once per address.

One module per stage: ``plan`` (pure), ``apply``, ``backoff``, ``owners`` (whose derived
credential a value is), ``cycle`` (the Reconciler, a package of one module per stage of a cycle:
``driver``, ``observe``, ``read``, ``planning``, ``generations``, ``rotation``, ``switches``,
``duplicates``). The commands that run it live elsewhere: ``loop`` (reconcile), ``status``.
"""

from maas_kubevirt.audit import Audit
from maas_kubevirt.reconcile.apply import Outcome, _classify, _fields, _perform, apply
from maas_kubevirt.reconcile.backoff import MAX_BACKOFF, WALL_FORMAT, Backoff, Wait
from maas_kubevirt.reconcile.cycle import (ROTATE, ROTATION_SETTLE, Cycle, Exposure, Reconciler, Switched,
                                          lowered_fix, lowered_generations, rotate_command)
from maas_kubevirt.reconcile.plan import (
    CHANGES, COMMISSION, CREATE_POOL, DEFAULT_POOL, DEFAULT_POOL_ID, DERIVED, DUPLICATE, MOVE_POOL, NEW, OTHER,
    PLACEHOLDER, RENAME, REREAD_STATUSES, RESET_PASSWORD, RIGHT, SET_PASSWORD, SKIP, SUSPECT, UNKNOWN, UNSET,
    UPDATES, Action, Match, Passwords, Power, Settings, assign_hostnames, claim_of, claims, duplicate_note,
    in_default_pool, is_new, machine_problem, matching, names_to_check, needs_pools, owned_pools, plan,
    pool_description, pool_of, suspect_note, trusted,
)

__all__ = [
    "Audit",
    "Outcome",
    "_classify",
    "_fields",
    "_perform",
    "apply",
    "MAX_BACKOFF",
    "WALL_FORMAT",
    "Backoff",
    "Wait",
    "Cycle",
    "Exposure",
    "ROTATE",
    "ROTATION_SETTLE",
    "rotate_command",
    "lowered_fix",
    "lowered_generations",
    "Reconciler",
    "Switched",
    "CHANGES",
    "COMMISSION",
    "CREATE_POOL",
    "DEFAULT_POOL",
    "DEFAULT_POOL_ID",
    "DERIVED",
    "DUPLICATE",
    "MOVE_POOL",
    "NEW",
    "OTHER",
    "PLACEHOLDER",
    "RENAME",
    "REREAD_STATUSES",
    "RESET_PASSWORD",
    "RIGHT",
    "SET_PASSWORD",
    "SKIP",
    "SUSPECT",
    "UNKNOWN",
    "UNSET",
    "UPDATES",
    "Action",
    "Match",
    "Passwords",
    "Power",
    "Settings",
    "assign_hostnames",
    "claim_of",
    "claims",
    "duplicate_note",
    "in_default_pool",
    "is_new",
    "machine_problem",
    "matching",
    "names_to_check",
    "needs_pools",
    "owned_pools",
    "plan",
    "pool_description",
    "pool_of",
    "suspect_note",
    "trusted",
]
