"""The credential generations the cluster says: read before any password is judged, never below
one already used, and a rotation's settling time before its password goes to MAAS."""

from __future__ import annotations

import shlex
from typing import Any, Mapping

from maas_kubevirt import identity
from maas_kubevirt.console import error, note, warn

# How long a new credential generation waits before its password goes to MAAS: Kyverno's
# rotation rule and the generate rule behind it re-derive <vm>-bmc within seconds on the
# control-plane tier (tests/test_rotation_tier.py); MAAS holding a password the BMC does not
# take yet would fail its power actions on the VM meanwhile.
ROTATION_SETTLE = 30.0


def lowered_fix(who: tuple[str, str], generation: int, system_namespace: str = "<system namespace>") -> str:
    """The command that puts a VM's generation back where the reconciler last used it."""
    patch = shlex.quote(f'{{"data":{{"{identity.format_serial(*who)}":"{generation}"}}}}')
    return (f"kubectl -n {system_namespace} patch configmap {identity.ROTATIONS_CONFIGMAP} --type merge "
            f"-p {patch}")


def lowered_generations(highest: Mapping[tuple[str, str], int],
                        said: Mapping[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """(vm, namespace) -> the generation the cluster says, for each VM it says one below the highest used."""
    return {who: said.get(who, 0) for who, used in sorted(highest.items()) if said.get(who, 0) < used}


def _audited_generation(serial: Any, generation: Any) -> tuple[tuple[str, str], int] | None:
    """((vm, namespace), generation) of an audit record's fields, or None when either is malformed."""
    try:
        return identity.parse_serial(serial), identity.parse_generation(str(generation))
    except identity.IdentityError:
        return None


class Generations:
    """The Reconciler's credential generations: ``highest`` used, ``lowered``, ``settling``,
    ``generations_unread``."""

    def _used(self, serial: Any, generation: Any) -> None:
        """An audited generation of a VM's credentials, when both fields are well formed."""
        audited = _audited_generation(serial, generation)
        if audited is not None:
            self._use(*audited)

    def _use(self, who: tuple[str, str], generation: int) -> None:
        """A generation of a VM's credentials set or rotated to: the least it may ever be derived at again."""
        if generation > self.highest.get(who, 0):
            self.highest[who] = generation
        if not self._generations_read and generation > self.passwords.generations.get(who, 0):
            self.passwords.generations[who] = generation   # judged so until the cluster is read

    def settling_notes(self) -> dict[tuple[str, str], str]:
        """(vm, namespace) -> why its password is not set this cycle: a rotation Kyverno has not yet
        followed, or a generation the cluster says that is below one already used."""
        now = self.wall()
        self.settling = {who: until for who, until in self.settling.items() if until > now}
        notes = {who: (f"password: generation {self.passwords.generation(*who)} goes to MAAS in "
                       f"{until - now:.0f} s, once Kyverno has re-derived {who[0]}-bmc")
                 for who, until in self.settling.items()}
        for who, said in self.lowered.items():
            notes[who] = (f"password: the cluster says credential generation {said}, below generation "
                          f"{self.highest[who]} already used: not derived again "
                          f"({lowered_fix(who, self.highest[who], self.system_namespace)})")
        return notes


    @property
    def system_namespace(self) -> str:
        """Where the rotations ConfigMap is, as the commands printed name it."""
        return getattr(self.rotator, "system_namespace", "<system namespace>")

    def _lowered(self, said: Mapping[tuple[str, str], int]) -> None:
        """Note, and warn once each, the VMs whose generation the cluster says below one already used."""
        lowered = lowered_generations(self.highest, said)
        for who, generation in lowered.items():
            if self.lowered.get(who) != generation:
                warn(f"{identity.format_serial(*who)}: the cluster says credential generation {generation}, below generation "
                     f"{self.highest[who]} this reconciler already used (the rotations ConfigMap was emptied, "
                     f"deleted or edited): its password is not derived again until it is put back: "
                     f"{lowered_fix(who, self.highest[who], self.system_namespace)}")
        self.lowered = lowered

    def withheld_note(self) -> str:
        """Why no password is derived this cycle ("" when one may be)."""
        return f"password: not derived while {self.generations_unread}" if self.generations_unread else ""

    def read_generations(self) -> None:
        """Every VM's credential generation, from the cluster, before any password is judged. When
        they cannot be read, what was last known stands (the audit log's at start): resets go on,
        and no new password is derived (``generations_unread``)."""
        if self.rotator is None:
            return
        try:
            said = {who: g for who, g in self.rotator.read().items() if g}
        except Exception as failure:  # noqa: BLE001 - any failure: no password may be derived
            unread = f"the credential generations cannot be read from the cluster ({failure})"
            if unread != self.generations_unread:
                error(f"{unread}: credentials are still taken back where they stand beside another address "
                      "or power type, but no password is derived until they can be read")
            self.generations_unread = unread
            return
        if self.generations_unread:
            note("the credential generations can be read from the cluster again")
        self.generations_unread = ""
        self._lowered(said)
        # Never below a generation already used: a ConfigMap emptied or lowered must not bring
        # rotated-away credentials back.
        generations = {**said, **{who: g for who, g in self.highest.items() if g > said.get(who, 0)}}
        if generations != self.passwords.generations:
            changed = {who for who in set(generations) | set(self.passwords.generations)
                       if generations.get(who, 0) != self.passwords.generation(*who)}
            if self._generations_read:   # not at start: a rotation (`rotate`) since the last cycle
                until = self.wall() + ROTATION_SETTLE
                self.settling.update((who, until) for who in changed if who not in self.settling)
            self.passwords.generations = dict(generations)
            # What was judged under other generations must be judged again.
            self.known.clear()
            if self.log is not None:
                self.log.request_resync("the credential generations changed")
        self._generations_read = True
