"""Following MAAS's event log: which machines changed since the last cycle, and when only a
full resync (listing every machine) can be trusted.

``EventLog`` is pure bookkeeping, fed by the MAAS client through a ``query`` callable; it keeps
one cursor per event stream, reads the new events in pages, picks the machines they name and
decides when the next cycle must resync instead.

What MAAS records, checked in canonical/maas (master, 3.8.0a1):

- Status transitions of a machine, every one, including enlistment: a signal on
  ``Node.status`` records ``NODE_CHANGED_STATUS`` ("Node changed status", level DEBUG)
  whenever a machine is saved with another status (``src/maasserver/models/signals/events.py``,
  ``src/maasserver/utils/signals.py``: the value at load is compared on save, so a machine
  created directly in New records nothing). Enlistment creates the machine with
  ``commission=True`` (``maas_run_remote_scripts.py`` ``enlist()``), i.e. New -> Commissioning
  on its first save (``MachineForm.save`` in ``src/maasserver/forms/__init__.py``), and the
  end of enlistment commissioning moves it Commissioning -> New (``src/metadataserver/api.py``,
  the ``enlisting`` NodeMetadata): the power parameters that the commissioning script uploads
  are in place by the second event. Commissioning, deploying, releasing and marking broken
  or fixed all pass through the same signal.
- Level DEBUG is below the API's default INFO: ``GET events/?op=query`` drops everything under
  the requested level, and ``level=AUDIT`` returns audit events only while any other level
  leaves them out (``src/maasserver/api/events.py``; AUDIT is 0, ``src/maascommon/events.py``).
  So two streams are followed: DEBUG (status changes) and AUDIT.
- API edits are not events: ``PUT machines/{id}/`` (hostname, pool, power type and power
  parameters) saves ``AdminMachineForm`` without an audit record
  (``src/maasserver/api/machines.py`` ``update``), and so does the anonymous power-parameter
  update at enlistment. Deleting a machine by the API records nothing (``delete`` in
  ``src/maasserver/api/nodes.py``), and any deletion detaches the machine's events, the UI's
  audit record of it included (``pre_delete_update_events`` in
  ``src/maasserver/models/signals/nodes.py`` sets their node to NULL, so the node-filtered
  query no longer returns them). Tag changes are audited without a node
  (``src/maasserver/api/tags.py``), so they are invisible per machine too.
- UI actions are audited: every node action (set pool, set zone, delete, commission, ...)
  records an AUDIT event of type "Node" naming the machine (``src/maasserver/node_action.py``).
- Events carry the type's description, not its name (``event_to_dict`` in
  ``src/maasserver/api/events.py``); the descriptions and levels come from
  ``src/maascommon/events.py`` (``EVENT_DETAILS_MAP``, re-exported as ``EVENT_DETAILS`` by
  ``src/provisioningserver/events.py``).
- ``after=<id>`` returns the ``limit`` (at most 1,000) oldest events with a greater id, newest
  first; only events of nodes that still exist. This snapshot of MAAS prunes nothing by
  itself, but operators delete old rows from ``maasserver_event`` to keep the table small.

Hence: a cycle reads the machines named by "Node changed status" and audited "Node" events;
what events miss (API renames, pool moves and power-address edits by hand, deletions, tags)
is caught by the full resync every ``maas.resync_interval``. A resync also runs at start,
after any failed or malformed event query, and when the log shows a gap: the first query of a
cycle asks for ``after=cursor - 1`` and must see the cursor's own event again; if it is gone,
events after it may be gone too (pruned, or detached by a deletion), so nothing seen can be
trusted to be complete.

One limit no cursor can close: event ids come from a database sequence, and a transaction
that took an id earlier may commit after a later one was read, so its event falls behind the
cursor. The periodic resync bounds how long such a change can go unnoticed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

# The streams followed, by the API's `level` names.
DEBUG, AUDIT = "DEBUG", "AUDIT"
STREAMS = (DEBUG, AUDIT)

# Event type descriptions (the API's `type` field) that may change what the plan sees.
STATUS_CHANGED = "Node changed status"    # NODE_CHANGED_STATUS, level DEBUG
NODE_ACTION = "Node"                       # NODE, level AUDIT: a UI node action
RELEVANT = {DEBUG: frozenset({STATUS_CHANGED}), AUDIT: frozenset({NODE_ACTION})}

# MAAS refuses a larger limit (MAX_EVENT_LOG_COUNT in src/maasserver/api/events.py).
PAGE_SIZE = 1000
# Pages read per stream and cycle (20,000 events, about 5 MB): room for every machine of a large
# MAAS changing status in one interval; a longer backlog is read on in the next cycles.
MAX_PAGES = 20

DEFAULT_RESYNC_INTERVAL = 3600.0

# query(level, after, limit) -> the events of one page (dicts with id, node, type, ...);
# after None means the newest events. It raises what the client raises.
Query = Callable[[str, "int | None", int], list]


class MalformedEvents(ValueError):
    """An event page MAAS sent is not what its API documents."""


@dataclass(frozen=True)
class Event:
    id: int
    node: str | None
    type: str


def parse_events(data: Any) -> list[Event]:
    """The events of one ``op=query`` page, oldest first; raises MalformedEvents."""
    if not isinstance(data, list):
        raise MalformedEvents("expected a list of events")
    events = []
    for item in data:
        if not isinstance(item, Mapping):
            raise MalformedEvents("expected each event to be a mapping")
        event_id, node, kind = item.get("id"), item.get("node"), item.get("type")
        if not isinstance(event_id, int) or isinstance(event_id, bool) or event_id < 0:
            raise MalformedEvents(f"expected a whole-number event id, found {event_id!r}")
        events.append(Event(event_id, node if isinstance(node, str) and node else None,
                            kind if isinstance(kind, str) else ""))
    events.sort(key=lambda event: event.id)
    return events


@dataclass
class Followed:
    """What the new events say: the machines to read, or why a resync is needed instead."""
    system_ids: set[str] = field(default_factory=set)
    events: int = 0
    resync: str = ""


class EventLog:
    """Cursors over the DEBUG and AUDIT streams and the resync schedule.

    ``resync_due()`` says whether the next cycle must list everything (and why); a resync calls
    ``begin_resync`` with each stream's newest id *before* listing and ``end_resync`` after
    (so a failed listing leaves the resync due); other cycles call ``follow``.
    """

    def __init__(self, resync_interval: float = DEFAULT_RESYNC_INTERVAL,
                 clock: Callable[[], float] = time.monotonic):
        self.resync_interval = float(resync_interval)
        self.clock = clock
        self.cursors: dict[str, int] = {}
        self.last_resync: float | None = None
        self.reason = ""   # why the log cannot be followed (a resync beyond the schedule)

    def resync_due(self) -> str:
        """Why the next cycle must be a full resync, or "" when the event log will do."""
        if self.reason:
            return self.reason
        if self.last_resync is None:
            return "start"
        if self.clock() - self.last_resync >= self.resync_interval:
            return f"every {self.resync_interval:g} s (maas.resync_interval)"
        return ""

    def request_resync(self, reason: str) -> None:
        if not self.reason:
            self.reason = reason

    def begin_resync(self, newest: Mapping[str, int | None]) -> None:
        """Start following after each stream's newest event (0: the stream is empty)."""
        self.cursors = {stream: int(newest.get(stream) or 0) for stream in STREAMS}

    def end_resync(self) -> None:
        self.last_resync = self.clock()
        self.reason = ""

    def newest(self, query: Query) -> dict[str, int | None]:
        """Each stream's newest event id (one request each), for ``begin_resync``."""
        found: dict[str, int | None] = {}
        for stream in STREAMS:
            events = parse_events(query(stream, None, 1))
            found[stream] = events[-1].id if events else None
        return found

    def follow(self, query: Query) -> Followed:
        """Read each stream's new events and name the machines they concern.

        A gap or a malformed page asks for a resync (and leaves the cursors where they were);
        a failed request propagates (the caller asks for a resync). A stream that was empty at
        the resync (cursor 0) has nothing to anchor on until its first event is seen.
        """
        result = Followed()
        moved: dict[str, int] = {}
        for stream in STREAMS:
            cursor = self.cursors.get(stream, 0)
            # Ask for the cursor's own event again: it proves nothing after it was dropped.
            after, anchor = (cursor - 1, cursor) if cursor > 0 else (0, None)
            for _ in range(MAX_PAGES):
                try:
                    page = parse_events(query(stream, after, PAGE_SIZE))
                except MalformedEvents as problem:
                    result.resync = f"malformed {stream} events: {problem}"
                    break
                events = page
                if anchor is not None:
                    if not page or page[0].id != anchor:
                        result.resync = (f"gap in the {stream} events: event {anchor} is gone "
                                         "(pruned, or its machine deleted)")
                        break
                    events, anchor = page[1:], None
                result.events += len(events)
                for event in events:
                    if event.node is not None and event.type in RELEVANT[stream]:
                        result.system_ids.add(event.node)
                if events:
                    cursor = after = events[-1].id
                if len(page) < PAGE_SIZE:  # a short page is the end of the log
                    break
            if result.resync:
                break
            moved[stream] = cursor
        if result.resync:
            self.request_resync(result.resync)
            result.system_ids = set()
            return result
        self.cursors.update(moved)
        return result

