"""Power addresses an attacker could hand MAAS for the VM web1 in namespace vms, under the
domain bmc.example.com: each names that VM in some way, and none is the canonical bare host.

A PXE host writes one in the script output it returns at enlistment, or a machine writes one
later through the metadata API (src/metadataserver/api.py, store_node_power_parameters). MAAS's
Redfish driver sends the password to whatever the address names, so each must be refused.
"""

DOMAIN = "bmc.example.com"
CANONICAL = "web1.vms.bmc.example.com"
IDENTITY = ("web1", "vms")

HOSTILE = [
    # schemes
    "https://web1.vms.bmc.example.com",
    "http://web1.vms.bmc.example.com",
    "HTTPS://WEB1.VMS.BMC.EXAMPLE.COM",
    "ftp://web1.vms.bmc.example.com",
    "//web1.vms.bmc.example.com",
    # ports
    "web1.vms.bmc.example.com:31234",
    "web1.vms.bmc.example.com:0",
    "web1.vms.bmc.example.com:443",
    "web1.vms.bmc.example.com:22/#",
    "https://web1.vms.bmc.example.com:8443",
    # userinfo
    "user@web1.vms.bmc.example.com",
    "user:pass@web1.vms.bmc.example.com",
    "https://maas@web1.vms.bmc.example.com",
    # paths, queries, fragments
    "web1.vms.bmc.example.com/",
    "web1.vms.bmc.example.com/redfish/v1",
    "http://web1.vms.bmc.example.com:31234/x?",
    "web1.vms.bmc.example.com?x=1",
    "web1.vms.bmc.example.com#frag",
    "web1.vms.bmc.example.com\\x",
    # trailing dots and spaces
    "web1.vms.bmc.example.com.",
    "web1.vms.bmc.example.com..",
    " web1.vms.bmc.example.com",
    "web1.vms.bmc.example.com ",
    "\tweb1.vms.bmc.example.com\n",
    "web1.vms.bmc.example.com\x00",
    # look-alike domains that still name the identity
    "web1.vms.bmc.example.com.evil.io",
    "web1.vms.bmc.example.com.nip.io",
    # percent-encoding
    "web1%2evms.bmc.example.com",
    "web1.vms.bmc.example%2ecom",
    "%77eb1.vms.bmc.example.com",
    # confusable Unicode and compatibility forms
    "\u212a" + "ube.vms.bmc.example.com",          # KELVIN SIGN, not K: names kube.vms
    "web1.vms.bmc.example.\u0441om",               # CYRILLIC SMALL LETTER ES
    "\uff57eb1.vms.bmc.example.com",               # FULLWIDTH LATIN SMALL LETTER W
    "web1\u3002vms.bmc.example.com",              # IDEOGRAPHIC FULL STOP
    "web1.vms.bmc.example.com\u200b",              # ZERO WIDTH SPACE
    "web1.vms.bmc.ex\u0430mple.com",               # CYRILLIC SMALL LETTER A
    # IDNA
    "xn--web1-.vms.bmc.example.com",
    "web1.vms.xn--bmc-.example.com",
    # IPv6 and IP literals beside the name
    "[::1]:443/web1.vms.bmc.example.com",
    "[web1.vms.bmc.example.com]",
    "10.0.0.1/web1.vms.bmc.example.com",
    # several hosts at once
    "web1.vms.bmc.example.com,evil.io",
    "web1.vms.bmc.example.com;evil.io",
]
