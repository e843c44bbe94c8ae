"""``python -m metrics build|check``: the Grafana board (:mod:`metrics._dashboard`)."""

import sys

from ._dashboard import main

sys.exit(main(sys.argv[1:]))
