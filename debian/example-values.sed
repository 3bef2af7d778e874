# Turns the built-in values.yaml into the example /etc/maas-kubevirt/values.yaml:
# its own header is replaced, and every other non-blank line gets one leading '#',
# so the file changes nothing until a line is uncommented (tests/test_deb.py checks
# that stripping that '#' gives back the defaults).
1i\
# maas-kubevirt site configuration, read by the maas-kubevirt service\
# (maas-kubevirt --values /etc/maas-kubevirt/values.yaml reconcile).\
#\
# Every setting below is commented out and shows its built-in default\
# (/usr/share/maas-kubevirt/values.yaml). To change one, remove the first '#'\
# of the setting and of its section line; what is left commented keeps the\
# default. Unknown keys are an error. The MAAS API key goes in\
# /etc/maas-kubevirt/api-key (mode 0600), never here; the service does not\
# start until that file exists.\

1,/^$/d
/./s/^/#/
