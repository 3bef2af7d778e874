import sys

from maas_kubevirt.cli import main

sys.exit(main())
