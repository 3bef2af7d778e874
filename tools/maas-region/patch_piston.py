"""Bring django-piston3 0.3rc2 (PyPI, 2015) up to the Django and Python a MAAS release runs on
(3.2 and 3.10 for MAAS 3.5, 4.2 and 3.12 for 3.6 and 3.7), in place, in the MAAS venv's
site-packages. MAAS itself uses its team's fork, which is
on neither PyPI nor Debian; these edits rename what Django and Python renamed or removed since
2015, and add the two names MAAS imports that only the fork has.

    python patch_piston.py SITE_PACKAGES

Every edit must find its text as many times as it says (or its replacement, already made), or nothing is
written and the exit status is 1. Running it again changes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

# (file, text in 0.3rc2, replacement[, how many times it is there])
EDITS = [
    ("authentication.py", "from django.core.urlresolvers import", "from django.urls import"),
    # request.REQUEST (GET and POST together) is gone; the check only asks which names are there.
    ("authentication.py", "req_params = request.REQUEST", "req_params = list(request.GET) + list(request.POST)"),
    ("doc.py", "from django.core.urlresolvers import", "from django.urls import"),
    # render_to_response went in Django 3.0; only piston's own HTML views (unused) call it.
    ("doc.py", "from django.shortcuts import render_to_response",
     "from django.shortcuts import render as render_to_response"),
    ("authentication.py", "from django.shortcuts import render_to_response",
     "from django.shortcuts import render as render_to_response"),
    ("doc.py", "inspect.getargspec(self.method)", "inspect.getfullargspec(self.method)[:4]"),
    ("decorator.py", "inspect.getargspec(func)", "inspect.getfullargspec(func)[:4]"),
    ("decorator.py",
     "inspect.formatargspec(regargs, varargs, varkwargs, defaults,\n"
     "                                      formatvalue=lambda value: \"\")[1:-1]",
     "str(inspect.signature(func))[1:-1]"),
    ("emitters.py", "from django.db.models import Model, permalink", "from django.db.models import Model"),
    ("emitters.py", "from django.utils.encoding import smart_text",
     "from django.utils.encoding import smart_str as smart_text"),
    ("emitters.py", "from django.core.urlresolvers import", "from django.urls import"),
    ("emitters.py", "from django.core.serializers.json import DateTimeAwareJSONEncoder",
     "from django.core.serializers.json import DjangoJSONEncoder as DateTimeAwareJSONEncoder"),
    # models.permalink went in Django 2.1: what it did, as a function.
    ("emitters.py", "reverser = permalink",
     "def reverser(func):\n"
     "    def resolve(*args, **kwargs):\n"
     "        bits = func(*args, **kwargs)\n"
     "        return reverse(bits[0], None, *bits[1:3])\n"
     "    return resolve"),
    ("emitters.py", "data._meta.fields, data._meta.virtual_fields", "data._meta.fields, data._meta.private_fields"),
    ("emitters.py", "data._meta.local_fields + data._meta.virtual_fields",
     "data._meta.local_fields + data._meta.private_fields"),
    ("emitters.py", "if not f.rel:", "if not f.remote_field:"),
    # inspect.getargspec went in Python 3.11; the first item (the argument names) is all it uses.
    ("emitters.py", "inspect.getargspec(", "inspect.getfullargspec(", 4),
    ("utils.py", "from django.core.urlresolvers import", "from django.urls import"),
    ("utils.py", "from django.utils.translation import ugettext as _",
     "from django.utils.translation import gettext as _"),
    # ForeignKey needs on_delete since Django 2.0; the default timestamp by name, as MAAS's
    # migration for this app refers to it.
    ("models.py", "related_name='consumers')", "related_name='consumers', on_delete=models.CASCADE)"),
    ("models.py", "related_name='tokens')", "related_name='tokens', on_delete=models.CASCADE)"),
    ("models.py", "consumer = models.ForeignKey(Consumer)", "consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE)"),
    ("models.py", "timestamp = models.IntegerField(default=int(time.time()))",
     "timestamp = models.IntegerField(default=get_default_timestamp)"),
    ("models.py", "class Nonce(models.Model):",
     "def get_default_timestamp():\n    return int(time.time())\n\n\nclass Nonce(models.Model):"),
    # A missing OAuth parameter is its own error (a 400 in MAAS, not a 401).
    ("oauth.py", "def build_authenticate_header(realm=''):",
     "class OAuthMissingParam(OAuthError):\n    pass\n\n\ndef build_authenticate_header(realm=''):"),
    ("oauth.py", "raise OAuthError('Parameter not found: %s' % parameter)",
     "raise OAuthMissingParam('Parameter not found: %s' % parameter)"),
]


def main(site_packages: str) -> int:
    package = Path(site_packages) / "piston3"
    texts: dict[str, str] = {}
    for name, old, new, *count in EDITS:
        expected = count[0] if count else 1
        text = texts.get(name) or (package / name).read_text(encoding="utf-8")
        if text.count(old) == 0 and new in text:
            texts[name] = text
            continue
        if text.count(old) != expected:
            print(f"patch_piston: {name}: expected {expected} of {old!r}, found {text.count(old)}", file=sys.stderr)
            return 1
        texts[name] = text.replace(old, new)
    for name, text in texts.items():
        (package / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
