"""maas-kubevirt: let Canonical MAAS manage KubeVirt virtual machines like bare-metal servers."""

__version__ = "0.1.0"
