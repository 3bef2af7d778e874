"""Carrying out a plan: one request per change (a machine's password, rename and pool move in one
PUT), one audit record per change, a refused commission backed off."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from maas_kubevirt import identity
from maas_kubevirt.audit import Audit
from maas_kubevirt.maas import MAASAuthError, MAASClient, MAASError
from maas_kubevirt.reconcile.backoff import Backoff
from maas_kubevirt.reconcile.plan import (
    COMMISSION, COMMISSIONING, CREATE_POOL, MOVE_POOL, PASSWORD_KEY, REDFISH, RENAME, RESET_PASSWORD, SET_PASSWORD,
    UPDATES, USER_KEY, Action, Passwords, pool_description,
)


@dataclass
class Outcome:
    ok: int = 0
    skipped: int = 0
    failed: int = 0
    interrupted: bool = False
    done: list[Action] = field(default_factory=list)


def _classify(action: Action, failure: MAASError) -> str:
    """"skipped" when MAAS moved on (the next cycle re-plans), "unknown" when the request may have
    been carried out (the next cycle reads it back), else "failed"."""
    if failure.in_flight:
        return "unknown"
    if failure.status == 404 or (action.kind in (SET_PASSWORD, RESET_PASSWORD) and failure.status == 409):
        return "skipped"
    if action.kind in (COMMISSION, RENAME) and failure.status in (400, 409):
        return "skipped"
    if action.kind == CREATE_POOL and failure.status == 400 and "already exist" in failure.message.lower():
        return "skipped"
    return "failed"


def _fields(action: Action, passwords: Passwords | None) -> dict[str, str]:
    """The PUT machines/{id}/ fields of one update (the client withholds power_pass from messages)."""
    if action.kind == SET_PASSWORD:
        if passwords is None:
            raise ValueError("set-password needs the seed: pass apply(..., passwords=Passwords(seed))")
        if not action.address:
            raise ValueError("set-password needs the canonical address it is written with")
        # The three BMC-row fields together: MAAS then updates the VM's own row in place
        # (Node.set_power_config, src/maasserver/models/node.py), a row no other machine can join.
        # The type too: an enlistment that switched it since the re-read is undone by this PUT,
        # never joined by the password (AdminMachineForm keeps what a request leaves out).
        return {"power_type": REDFISH,
                "power_parameters_power_address": action.address,
                "power_parameters_power_user": passwords.user(action.vm, action.namespace),
                "power_parameters_power_pass": passwords.password(action.vm, action.namespace)}
    if action.kind == RENAME:
        return {"hostname": action.after}
    return {"pool": action.after}


def _reset_fields(action: Action, passwords: Passwords | None) -> dict[str, str]:
    """The PUT machines/{id}/ fields that take a derived user and password back: the machine's
    reset user (identity.reset_user) and the placeholder. A redfish machine keeps its address and says its type (a switch to
    ipmi landing meanwhile is undone, with the address MAAS fills in; one MAAS cannot fill in is
    refused, 400, and reset by type the next cycle); any other type is reset through the names
    that hold them, as its own form calls them, and keeps its type."""
    if passwords is None:
        raise ValueError("reset-password needs the seed: pass apply(..., passwords=Passwords(seed))")
    fresh = {USER_KEY: passwords.reset_user(str(action.system_id)), PASSWORD_KEY: identity.PLACEHOLDER_PASSWORD}
    if action.power_type not in (None, REDFISH) and action.keys:
        return {f"power_parameters_{name}": fresh[kind] for name, kind in action.keys}
    return {"power_type": REDFISH, "power_parameters_power_user": fresh[USER_KEY],
            "power_parameters_power_pass": fresh[PASSWORD_KEY]}


def _perform(client: MAASClient, actions: Sequence[Action], passwords: Passwords | None) -> None:
    """One request: one of each kind, or the password, rename and pool move of one machine together."""
    action = actions[0]
    if action.kind in UPDATES:
        fields: dict[str, str] = {}
        for each in actions:
            fields.update(_fields(each, passwords))
        client.update_machine(action.system_id, **fields)
    elif action.kind == RESET_PASSWORD:
        client.update_machine(action.system_id, **_reset_fields(action, passwords))
    elif action.kind == CREATE_POOL:
        client.create_pool(action.after, pool_description(action.namespace))
    elif action.kind == COMMISSION:
        client.commission(action.system_id, skip_bmc_config=True)
    else:  # pragma: no cover - plan makes no other kind that changes
        raise ValueError(f"unknown action {action.kind}")



def _batches(actions: Sequence[Action]) -> list[list[Action]]:
    """The changing actions in order, a machine's consecutive password, rename and pool move as one."""
    batches: list[list[Action]] = []
    for action in actions:
        if not action.changes:
            continue
        last = batches[-1] if batches else None
        if (last and action.kind in UPDATES and last[-1].kind in UPDATES
                and last[-1].system_id == action.system_id):
            last.append(action)
        else:
            batches.append([action])
    return batches


# What MAAS shows of a machine whose commission it went on with after the request stopped waiting.
COMMISSIONED_STATUSES = (COMMISSIONING, "Testing", "Ready")


def _lanes(batches: Sequence[list[Action]]) -> list[list[list[Action]]]:
    """The batches in lanes that may run side by side: one machine's in its order, and a machine
    whose rename takes the name another one's rename frees in the same lane, after it."""
    root: dict[str | None, str | None] = {}

    def find(system_id: str | None) -> str | None:
        while root[system_id] != system_id:
            system_id = root[system_id]
        return system_id

    frees: dict[str, str | None] = {}     # lower-cased old name -> the machine renamed away from it
    for batch in batches:
        for action in batch:
            root.setdefault(action.system_id, action.system_id)
            if action.kind == RENAME and isinstance(action.before, str):
                frees[action.before.lower()] = action.system_id
    for batch in batches:
        for action in batch:
            freed_by = frees.get(action.after.lower()) if action.kind == RENAME and action.after else None
            if freed_by is not None and find(freed_by) != find(action.system_id):
                root[find(action.system_id)] = find(freed_by)
    lanes: dict[str | None, list[list[Action]]] = {}
    for batch in batches:
        lanes.setdefault(find(batch[0].system_id), []).append(batch)
    return list(lanes.values())


def apply(client: MAASClient, actions: Iterable[Action], audit: Audit,
          stop: threading.Event | None = None, passwords: Passwords | None = None,
          backoff: Backoff | None = None, concurrency: int = 1,
          may_write: Callable[..., bool] | None = None) -> Outcome:
    """Carry out the changing actions; one audit record per attempted change.

    A machine's password, rename and pool move go in one PUT; when MAAS refuses it (400) each is
    sent on its own, so that a taken name never holds back the password. A move waits for its
    pool and a commission for its machine's password. A commission MAAS refuses starts or
    lengthens that machine's backoff, named in its audit record. With ``concurrency`` above 1
    the pools are made first, then up to that many machines' changes go at once (``_lanes``),
    each machine's still in order. ``may_write(seconds)`` is asked before every request with the
    client's timeout (``lease.Candidate.may_write``): False (a leader that could not renew its
    lease in time) starts no further one, as a signal does. A commission, which may take longer
    than any lease, is asked again once MAAS answers (``may_write()``: held now); lost meanwhile,
    its audit record's note says so and what MAAS did, and no further request starts.
    """
    outcome = Outcome()
    lock = threading.RLock()      # the outcome, the backoff and whole audit records, one at a time
    halt = threading.Event()      # a signal or the deadline: no lane starts another request
    failed_pools: set[str] = set()
    other_pools: set[str] = set()   # refused as existing (someone else's, as far as is known) or unknown
    no_password: set[str | None] = set()

    def record(action: Action, result: str, reason: str = "") -> None:
        with lock:
            _record(action, result, reason)

    def _record(action: Action, result: str, reason: str) -> None:
        if result == "ok":
            outcome.ok += 1
            outcome.done.append(action)
        elif result == "skipped":
            outcome.skipped += 1
        else:
            outcome.failed += 1
        if action.kind == SET_PASSWORD and result != "ok":
            no_password.add(action.system_id)
        if action.kind == CREATE_POOL and result != "ok":
            (failed_pools if result == "failed" else other_pools).add(action.after)
        if action.kind == COMMISSION and backoff is not None:
            if result == "ok":
                backoff.commissioned(action.system_id)
            elif result in ("failed", "unknown"):
                wait = backoff.failed(action.system_id, reason)
                audit.record(action, result, reason, **wait.audited())
                return
        if action.kind in (SET_PASSWORD, RESET_PASSWORD):  # restored after a restart (Reconciler.restore)
            generation = passwords.generation(action.vm, action.namespace) if passwords is not None else 0
            extra: dict[str, Any] = {}
            if action.kind == SET_PASSWORD:   # the least the reconciler ever derives again (Reconciler.highest)
                extra = {"generation": generation}
            elif action.leak:   # the generation that may have leaked
                extra = {"leak": True, "generation": generation}
            if action.kind == RESET_PASSWORD and action.power_type not in (None, REDFISH):
                extra["power_type"] = action.power_type
            audit.record(action, result, reason, identity=f"{action.vm}.{action.namespace}", **extra)
            return
        audit.record(action, result, reason)

    def send(batch: list[Action]) -> bool:
        """Carry out one batch; False when the cycle must stop (a signal, the deadline, the lease)."""
        commission = batch[0].kind == COMMISSION
        # A commission starts with an ordinary request's margin too: MAAS commits Commissioning
        # within it, before the power-on its answer waits for, which no lease margin covers.
        seconds = getattr(client, "timeout", None)   # None: a stand-in client stating none
        if stop is not None and stop.is_set():
            return False   # a signal between two fields of a split PUT: no further field
        if may_write is not None and not (may_write() if seconds is None else may_write(seconds)):
            return False   # not attempted, so not audited: the next holder plans it afresh

        def answered(action: Action, what: str) -> Action:
            """The action as audited when the lease was lost while MAAS answered its commission."""
            said = f"the lease was lost while MAAS answered: {what}; no further write from this cycle"
            return replace(action, note=f"{action.note}; {said}" if action.note else said)

        try:
            _perform(client, batch, passwords)
        except MAASAuthError:
            raise
        except MAASError as failure:
            if len(batch) > 1 and failure.status == 400:
                return all(send([action]) for action in batch)
            held = not commission or may_write is None or may_write()
            stopped = failure.kind in ("interrupted", "deadline")  # every later request fails alike
            if commission and failure.in_flight and not stopped:
                status = _status_now(batch[0].system_id)
                if status in COMMISSIONED_STATUSES:  # MAAS went on after the request stopped waiting
                    action = batch[0] if held else answered(batch[0], f"MAAS went on, it shows the machine {status}")
                    record(action, "ok", f"{failure}; MAAS shows the machine {status}")
                    return held
            what = "MAAS may have carried it out (no answer)" if failure.in_flight else "MAAS refused it"
            for action in batch:
                record(action if held else answered(action, what),
                       ("unknown" if failure.in_flight else "failed") if stopped else _classify(action, failure),
                       str(failure))
            return held and not stopped
        held = not commission or may_write is None or may_write()
        for action in batch:
            record(action if held else answered(action, "MAAS accepted the commission"), "ok")
        return held

    def _status_now(system_id: str | None) -> str | None:
        """The machine's status as MAAS shows it now, or None when it cannot be read."""
        try:
            found = client.machines_by_id([str(system_id)])
        except MAASError:
            return None
        status = found[0].get("status_name") if found and isinstance(found[0], dict) else None
        return status if isinstance(status, str) else None

    def carry_out(lane: Sequence[list[Action]]) -> None:
        for batch in lane:
            if halt.is_set() or (stop is not None and stop.is_set()):
                halt.set()
                return
            ready = []
            for action in batch:
                with lock:
                    if action.kind == MOVE_POOL and action.after in failed_pools:
                        record(action, "failed", f"the pool {action.after} could not be created")
                    elif action.kind == MOVE_POOL and action.after in other_pools:
                        # Made by someone else meanwhile, perhaps: never filled until a re-read shows whose.
                        record(action, "skipped", f"the pool {action.after} was not created by this cycle: "
                               "moved only once the next cycle has read whose it is")
                    elif action.kind == COMMISSION and action.system_id in no_password:
                        record(action, "skipped", "the BMC password is not in place: not commissioned")
                    else:
                        ready.append(action)
            try:
                if ready and not send(ready):
                    halt.set()
                    return
            except BaseException:
                halt.set()
                raise

    batches = _batches(list(actions))
    if concurrency <= 1:
        carry_out(batches)
    else:
        carry_out([b for b in batches if b[0].kind == CREATE_POOL])   # before anything moves in
        lanes = _lanes([b for b in batches if b[0].kind != CREATE_POOL])
        with ThreadPoolExecutor(max_workers=min(concurrency, max(1, len(lanes))),
                                thread_name_prefix="maas-apply") as workers:
            for done in [workers.submit(carry_out, lane) for lane in lanes]:
                done.result()   # a refused API key stops them all, and reaches the caller
    outcome.interrupted = halt.is_set()
    return outcome


