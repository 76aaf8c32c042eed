"""``python -m memagent_cli ...`` (and ``deepspeed --module memagent_cli train ...``)."""

import sys

from memagent_cli.main import main

sys.exit(main())
