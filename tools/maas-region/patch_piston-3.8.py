"""django-piston3 for MAAS master (3.8), after patch_piston.py: Django 5.2 has no
UserManager.make_random_password (gone in 5.1), which piston calls for keys, secrets and verifiers.
What it did (Django 4.2's django/contrib/auth/base_user.py) becomes a function of piston's own.
A file of its own, so that the older series' builds, which do not need it, are not rebuilt.

    python patch_piston-3.8.py SITE_PACKAGES
"""

from __future__ import annotations

import sys

import patch_piston

EDITS = [
    ("models.py", "User.objects.make_random_password(", "make_random_password(", 3),
    ("managers.py", "User.objects.make_random_password(", "make_random_password(", 3),
    ("models.py", "import User\nfrom django.core.mail", "import User\n"
     "from .managers import make_random_password\nfrom django.core.mail"),
    ("managers.py", "import User\n\nKEY_SIZE", "import User\n"
     "from django.utils.crypto import get_random_string\n\n\n"
     "def make_random_password(length=10, allowed_chars=\"abcdefghjkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789\"):\n"
     "    return get_random_string(length, allowed_chars)\n\nKEY_SIZE"),
]

if __name__ == "__main__":
    patch_piston.EDITS = EDITS
    sys.exit(patch_piston.main(sys.argv[1]))
