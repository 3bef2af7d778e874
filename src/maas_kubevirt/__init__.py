"""maas-kubevirt: let Canonical MAAS manage KubeVirt virtual machines like bare-metal servers."""

__version__ = "0.1.0"

PROG = "maas-kubevirt"
# Exit status of every command: 0 done or nothing to do, 1 some actions failed, 2 usage or configuration.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# `reconcile --dry-run --detailed-exitcode` only: changes are pending (terraform plan's 2 is
# taken: 2 is a configuration error here, and the unit's RestartPreventExitStatus=2).
EXIT_PENDING = 3
