"""Warm pools of KubeVirt VMs per size class (the values key ``pools``), MAAS's VM hosts replaced.

One module per stage: ``spec`` (a pool from the values), ``vm`` (the VM a pool makes),
``observe`` (what the cluster and MAAS say of each pool), ``plan`` (pure: what to create, tag
and delete), ``apply`` (carrying it out, audited). The reconciler runs them as one more stage
of its cycle; ``compose`` and ``decompose`` are the commands.
"""
